"""Iceberg manifest entries, decoded once per gateway process.

A table fed by a mover gains one manifest per commit until compaction or a manifest rewrite
folds them. pyiceberg decodes every manifest of a snapshot each time that snapshot is planned
(2-3 ms per manifest here), and each mover commit is a new snapshot, so planning cost grew with
the commits since the last compaction, and a since-read (``added_data_files``) decoded every
manifest of every snapshot it walked. Manifests are immutable files named once (the spec's
"manifests are never rewritten"), so their entries are cached by path: planning a new snapshot
decodes only its new manifests.

The location check still runs on every use: ``io.new_input`` checks the path against the
reading source's allow-list (``planners.iceberg_io``) before a cached entry is handed out, so
one source's cache hit never reads a file another source's reach would refuse.

Entries are shared between threads and plans; pyiceberg's planner and the harness only read
them after ``fetch_manifest_entry`` has built them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from planners.in_flight import InFlight

#: Entries kept over all cached manifests (a data file's entry with column statistics is a
#: few KB): bounds the cache's memory whatever the tables' sizes.
MAX_ENTRIES = 50_000

_lock = threading.Lock()
_cache: OrderedDict[tuple[str, bool], tuple[Any, ...]] = OrderedDict()
_held = 0
_stats = {"hits": 0, "misses": 0}
#: How long a caller waits for another one decoding the same manifest before it decodes it.
DECODE_WAIT_S = 30.0
#: Manifests being decoded, each by one caller: a process new to a table (a replica restarted
#: under failover got 16 readers at once) otherwise decoded each manifest once per reader.
_decoding = InFlight(DECODE_WAIT_S)


def entries(io: Any, manifest: Any, discard_deleted: bool = True) -> list[Any]:
    """``manifest.fetch_manifest_entry(io, discard_deleted)``, from the cache when it holds it."""
    path = str(manifest.manifest_path)
    io.new_input(path)  # the guard's check: raises PERMISSION_DENIED for an outside file
    key = (path, bool(discard_deleted))

    def cached() -> tuple[Any, ...] | None:
        with _lock:
            return _hit(key)

    def make() -> tuple[Any, ...]:
        global _held
        with _lock:
            _stats["misses"] += 1
        found = tuple(_decode(io, manifest, discard_deleted))
        if len(found) <= MAX_ENTRIES // 4:  # one huge manifest would evict everything else
            with _lock:
                if key not in _cache:
                    _cache[key] = found
                    _held += len(found)
                while _held > MAX_ENTRIES:
                    _, dropped = _cache.popitem(last=False)
                    _held -= len(dropped)
        return found

    return list(_decoding.get(key, cached, make))


def _hit(key: tuple[str, bool]) -> tuple[Any, ...] | None:
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        _stats["hits"] += 1
    return hit


def _decode(io: Any, manifest: Any, discard_deleted: bool) -> list[Any]:
    fetch = _fetch or type(manifest).fetch_manifest_entry
    return list(fetch(manifest, io, discard_deleted=discard_deleted))


#: pyiceberg's own ``ManifestFile.fetch_manifest_entry``, once ``cache_pyiceberg_reads`` ran.
_fetch: Any = None


def cache_pyiceberg_reads() -> None:
    """Make pyiceberg's own reads of manifest entries in this process go through the cache.

    An overwrite (a compaction's rewrite, an overwrite of a source) decodes every manifest of
    its parent snapshot twice, for the entries it deletes and for the manifests it keeps, under
    the source's write lease: ~0.25 s idle at 220 manifests, about 18 s in a loaded gateway
    (Python competing for the GIL), which every writer of the source waited for. Those are the
    manifests the source's readers decoded already. pyiceberg only reads the entries it fetches
    (it makes new ones for what it writes), so sharing them is safe."""
    global _fetch
    from pyiceberg.manifest import ManifestFile

    with _lock:
        if _fetch is not None:
            return
        _fetch = ManifestFile.fetch_manifest_entry

    def fetch_manifest_entry(self: Any, io: Any, discard_deleted: bool = True) -> list[Any]:
        return entries(io, self, discard_deleted)

    ManifestFile.fetch_manifest_entry = fetch_manifest_entry  # type: ignore[method-assign]


class CachedManifest:
    """A pyiceberg ``ManifestFile`` whose entries come from the cache: its planner reads the
    manifest's summary fields as usual and calls ``fetch_manifest_entry`` for the entries."""

    __slots__ = ("_manifest",)

    def __init__(self, manifest: Any) -> None:
        self._manifest = manifest

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manifest, name)

    def fetch_manifest_entry(self, io: Any, discard_deleted: bool = True) -> list[Any]:
        return entries(io, self._manifest, discard_deleted)


def cached(manifests: Iterable[Any]) -> list[CachedManifest]:
    return [CachedManifest(m) for m in manifests]


def stats() -> dict[str, int]:
    """Hits, misses and entries held (for tests and the metrics endpoint)."""
    with _lock:
        return {**_stats, "entries": _held, "manifests": len(_cache)}


def clear() -> None:
    global _held
    with _lock:
        _cache.clear()
        _held = 0
