"""Source kinds by name: built-ins and third-party kinds, found through entry points.

A kind is registered in the ``dataharness.sources`` entry-point group (``name =
"package.module:KindClass"``) and imported on first use, so unused backends are never imported.
The project's own kinds are declared the same way in ``pyproject.toml``; ``BUILTIN`` repeats them
with the extra that installs their client library, for the install hint and for running from a
source tree whose entry points are not installed.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import threading

from flight_gateway.errors import InvalidArgument, Unavailable
from planners.kind import SourceKind

log = logging.getLogger(__name__)
GROUP = "dataharness.sources"

# name: (module:class, extra that installs its dependencies)
BUILTIN: dict[str, tuple[str, str]] = {
    "files": ("planners.files:FilesKind", "core"),
    "iceberg": ("planners.iceberg:IcebergKind", "iceberg"),
    "ducklake": ("planners.ducklake:DuckLakeKind", "ducklake"),
    "flight": ("planners.flight:FlightKind", "core"),
    "kafka": ("planners.kafka:KafkaKind", "kafka"),
    "postgres": ("planners.postgres:PostgresKind", "postgres"),
    "delta": ("planners.delta:DeltaKind", "delta"),
    "paimon": ("planners.paimon:PaimonKind", "paimon"),
}

_instances: dict[str, SourceKind] = {}
_lock = threading.Lock()


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Installed kinds, scanned afresh (a package installed while the gateway runs is found)."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=GROUP):
        if ep.name in BUILTIN and ep.value != BUILTIN[ep.name][0]:
            log.warning(
                "ignoring entry point %s = %s: %r is a built-in kind", ep.name, ep.value, ep.name
            )
            continue
        found.setdefault(ep.name, ep)
    return found


def available() -> list[str]:
    """Names of every kind that can be loaded (without importing any of them)."""
    return sorted(set(BUILTIN) | set(_entry_points()))


def _load(name: str) -> SourceKind:
    if name in BUILTIN:
        target, extra = BUILTIN[name]
        hint = f"pip install 'dataharness-flight-gateway[{extra}]'"
    else:
        ep = _entry_points().get(name)
        if ep is None:
            raise InvalidArgument(f"unknown source kind {name!r} (known: {available()})")
        target = ep.value
        dist = ep.dist.name if ep.dist is not None else "the package that provides it"
        hint = f"reinstall {dist}"
    module_name, _, cls_name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except ImportError as e:
        raise Unavailable(f"source kind {name!r} cannot be imported: {hint} ({e})") from e
    except AttributeError as e:
        raise Unavailable(f"source kind {name!r}: {target} does not exist ({e})") from e
    if not (isinstance(cls, type) and issubclass(cls, SourceKind)):
        raise Unavailable(f"source kind {name!r}: {target} is not a SourceKind subclass")
    kind = cls()
    kind.name = name
    return kind


def get_kind(name: str) -> SourceKind:
    """The kind called ``name`` (one shared instance), importing it on first use."""
    with _lock:
        kind = _instances.get(name)
        if kind is None:
            kind = _instances[name] = _load(name)
        return kind
