"""PinnedRows rows of versioned tables, kept for the next read (per process, bounded).

A versioned table read at ``as_of`` T2 is the table read at an earlier T1, plus the row
versions written in (T1, T2] -- as long as no row version visible at T1 was closed (updated,
deleted, drained) in (T1, T2]. That is how a table streamed into is read over and over under
writers: every read pins a newer ``as_of``, and reading every pinned row again (the server's
scan, COPY, the driver's decoding) grew with the table, for rows the last read already had
(``bench_chaos``: the versioned source is never drained, and each of 64 readers copied all of
it). A read now takes the newest rows this cache holds at or before its ``as_of`` and asks
the server only whether anything was closed since (then it reads everything again) and for
the rows written since.

Why this is exact (``planners.postgres.versioning``): a row version visible at T2 either
started at or before T1 -- then it was visible at T1, and is in the cached rows -- or after T1,
and then the second query returns it. A version visible at T1 but not at T2 was closed in
(T1, T2], and its closed copy is in the history table: the first query sees it, and the read
falls back to all rows. Writers commit before the ``as_of`` that shows their rows, so the rows
of (T1, T2] are all there when T2 is read. Deleting history rows bypasses history and would
break reads at old ``as_of`` values anyway.

Entries are keyed by everything that decides the rows: DSN, the query's text without its
instant (columns, filter, key range), the selected columns' types, and the table's oid and file
node (a table dropped and created again under its name, or truncated, leaves no history). Per key the newest few
instants are kept; they share the older rows' buffers (a table of chunks).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

MAX_BYTES = 64 << 20  # per process
PER_KEY = 4  # instants kept per key
CLAIM_S = 60.0  # how long one read may keep others from keeping a key's rows
MAX_CHUNKS = 64  # an entry's chunks are combined past this (each read adds one)


@dataclass(frozen=True)
class PinnedRows:
    """Every row the query returns at ``as_of`` (``at``: its value as the state wrote it)."""

    as_of: dt.datetime
    at: str
    rows: pa.Table


def instant(as_of: str) -> dt.datetime | None:
    """``as_of`` as an aware datetime; None when it is not one Python can compare."""
    try:
        value = dt.datetime.fromisoformat(as_of)
    except ValueError:
        return None
    return value if value.tzinfo is not None else None


class PinnedCache:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, list[PinnedRows]] = OrderedDict()  # newest last
        self._bytes: dict[str, int] = {}
        self._filling: dict[str, float] = {}  # key -> when a read began keeping its rows
        # Reads served whole, extended by the rows written since, or read again (per key).
        self.hits: Counter[str] = Counter()
        self.extended: Counter[str] = Counter()
        self.misses: Counter[str] = Counter()

    def before(self, key: str, as_of: dt.datetime) -> PinnedRows | None:
        """The newest entry at or before ``as_of``."""
        with self._lock:
            kept = self._entries.get(key, [])
            found = [p for p in kept if p.as_of <= as_of]
            if not found:
                return None
            self._entries.move_to_end(key)
            return max(found, key=lambda p: p.as_of)

    def add(self, key: str, entry: PinnedRows) -> None:
        combined = entry.rows.num_columns > 0 and entry.rows.column(0).num_chunks > MAX_CHUNKS
        if combined:
            entry = PinnedRows(entry.as_of, entry.at, entry.rows.combine_chunks())
        if entry.rows.nbytes > self.max_bytes // 4:
            return  # one read's worth of rows: not worth evicting everything else for
        with self._lock:
            kept = [p for p in self._entries.get(key, []) if p.as_of != entry.as_of]
            # Entries of a key share buffers, except across a combine: keep only this one then.
            kept = [] if combined else kept
            kept = sorted([*kept, entry], key=lambda p: p.as_of)[-PER_KEY:]
            self._entries[key] = kept
            self._entries.move_to_end(key)
            self._bytes[key] = max(p.rows.nbytes for p in kept)
            while sum(self._bytes.values()) > self.max_bytes and len(self._entries) > 1:
                old, _ = self._entries.popitem(last=False)
                self._bytes.pop(old, None)

    def claim(self, key: str) -> bool:
        """Whether the caller may fill ``key`` (no other read is); ``release`` after. A claim
        older than ``CLAIM_S`` lapses: a stream dropped unread releases only when collected."""
        now = time.monotonic()
        with self._lock:
            if now - self._filling.get(key, -CLAIM_S) < CLAIM_S:
                return False
            self._filling[key] = now
            return True

    def release(self, key: str) -> None:
        with self._lock:
            self._filling.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes.clear()
            self.hits.clear()
            self.extended.clear()
            self.misses.clear()


CACHE = PinnedCache()


def cache_key(
    dsn: str, table: str, query: str, types: dict[str, str], storage: tuple[int, int] = (0, 0)
) -> str:
    """``table/digest``: hashed, as the DSN may hold a password. ``storage``: the table's oid
    and file node (a table created again, or truncated, keeps nothing of before)."""
    shape = [dsn, query, types, list(storage)]
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()
    return f"{table}/{digest}"


def kept(
    reader: pa.RecordBatchReader,
    key: str,
    at: dt.datetime,
    as_of: str,
    cache: PinnedCache = CACHE,
    base: pa.Table | None = None,
) -> pa.RecordBatchReader:
    """``base`` (rows kept at an earlier instant), then ``reader``'s rows (those written since,
    or all of them), streamed; added to ``cache`` as the rows at ``at`` when read to the end and
    they fit. One read per key keeps its rows at a time (the others just stream): rows held while
    they stream are bounded by the keys being filled, not by the reads in flight."""
    schema = reader.schema if base is None else base.schema
    if base is not None and not reader.schema.equals(base.schema):
        raise ValueError(f"rows written since came as {reader.schema}, not {base.schema}")
    first = [] if base is None else base.to_batches()
    mine = cache.claim(key)

    def gen() -> Iterator[pa.RecordBatch]:
        held: list[pa.RecordBatch] | None = [] if mine else None
        size = 0
        try:
            for batch in itertools.chain(first, reader):
                if held is not None:
                    size += batch.nbytes
                    if size <= cache.max_bytes // 4:
                        held.append(batch)
                    else:
                        held = None
                yield batch
            if held is not None:
                cache.add(key, PinnedRows(at, as_of, pa.Table.from_batches(held, schema)))
        finally:
            if mine:
                cache.release(key)

    return pa.RecordBatchReader.from_batches(schema, gen())
