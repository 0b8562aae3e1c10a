"""Decoded offset ranges of a partition, kept for the next read (per process, bounded).

A message's offset never changes, so the rows decoded from ``[a, b)`` of a partition are the
same for every read that covers it: a table streamed into is read again and again over a range
that only grows at its end (until a mover drains its start). Consuming and decoding each
message again in Python (``consume_range`` and ``Decoder.decode``) held a read process's
interpreter lock half of the time under ``bench_chaos``'s failover load (py-spy ``--gil``,
2026-12-04). A read now takes what this cache holds of its range and consumes only the rest.

Entries are keyed by everything that decides the rows: cluster, topic, partition, consumer
settings (``isolation.level`` decides which messages are seen), and the decoder (format,
schemas, key column, error policy). Each entry is a run of covered ranges with their rows
and each row's offset; the least recently used ranges go past ``MAX_BYTES``.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import threading
from array import array
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

MAX_BYTES = 64 << 20  # per process


@dataclass(frozen=True)
class Piece:
    """Every message of ``[low, high)`` the decoder kept, and their offsets."""

    low: int
    high: int
    rows: pa.Table
    offsets: array[int]  # ascending

    def part(self, low: int, high: int) -> pa.Table:
        """The rows of offsets in ``[low, high)`` (within this piece)."""
        start = bisect.bisect_left(self.offsets, low)
        stop = bisect.bisect_left(self.offsets, high)
        return self.rows.slice(start, stop - start)


class RangeCache:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._pieces: dict[str, list[Piece]] = {}  # per key, sorted by low, disjoint
        self._used: OrderedDict[tuple[str, int], int] = OrderedDict()  # (key, low) -> bytes
        self._bytes = 0
        # Rows served from here and rows consumed, per key (for tests and metrics).
        self.hits: Counter[str] = Counter()
        self.misses: Counter[str] = Counter()

    def covering(self, key: str, offset: int) -> Piece | None:
        with self._lock:
            pieces = self._pieces.get(key, [])
            i = bisect.bisect_right([p.low for p in pieces], offset) - 1
            if i < 0 or pieces[i].high <= offset:
                return None
            piece = pieces[i]
            self._used.move_to_end((key, piece.low))
            return piece

    def next_low(self, key: str, offset: int) -> int | None:
        """Where the first piece after ``offset`` starts (None: no later piece)."""
        with self._lock:
            lows = [p.low for p in self._pieces.get(key, [])]
            i = bisect.bisect_right(lows, offset)
            return lows[i] if i < len(lows) else None

    def add(self, key: str, piece: Piece) -> None:
        size = piece.rows.nbytes + piece.offsets.itemsize * len(piece.offsets)
        if size > self.max_bytes // 4:
            return  # one read's worth of rows: not worth evicting everything else for
        with self._lock:
            pieces = self._pieces.setdefault(key, [])
            lows = [p.low for p in pieces]
            i = bisect.bisect_right(lows, piece.low)
            before = pieces[i - 1] if i > 0 else None
            after = pieces[i] if i < len(pieces) else None
            if (before and before.high > piece.low) or (after and after.low < piece.high):
                return  # another read added an overlapping piece meanwhile
            pieces.insert(i, piece)
            self._used[(key, piece.low)] = size
            self._bytes += size
            while self._bytes > self.max_bytes and self._used:
                (k, low), n = self._used.popitem(last=False)
                self._bytes -= n
                kept = self._pieces[k]
                kept.pop(bisect.bisect_left([p.low for p in kept], low))
                if not kept:
                    del self._pieces[k]

    def clear(self) -> None:
        with self._lock:
            self._pieces.clear()
            self._used.clear()
            self._bytes = 0
            self.hits.clear()
            self.misses.clear()


CACHE = RangeCache()


def cache_key(config: object, schemas: tuple[pa.Schema, ...], **decoder: object) -> str:
    """The rows of a range depend on these and nothing else: ``topic/partition/digest``."""
    fields = {n: getattr(config, n) for n in (
        "bootstrap_servers", "topic", "partition", "format", "avro_schema",
        "schema_registry_url", "key_column", "on_error", "dead_letter_topic", "consumer",
    )}  # fmt: skip
    shapes = [s.serialize().to_pybytes().hex() for s in schemas]
    # Hashed: consumer settings may hold credentials, which a key should not carry around.
    digest = hashlib.sha256(
        json.dumps([fields, shapes, decoder], sort_keys=True, default=str).encode()
    ).hexdigest()
    return f"{fields['topic']}/{fields['partition']}/{digest}"


def cached_range(
    key: str,
    low: int,
    high: int,
    consume: Callable[[int, int], Iterator[tuple[pa.Table, array[int], int]]],
    cache: RangeCache = CACHE,
) -> Iterator[pa.Table]:
    """The rows of ``[low, high)``: what ``cache`` holds, the rest from ``consume(a, b)``,
    which yields (rows, their offsets, the offset it has read up to) and must cover ``[a, b)``
    whole by its last yield; what it yields is added to the cache."""
    at = low
    while at < high:
        piece = cache.covering(key, at)
        if piece is not None:
            stop = min(high, piece.high)
            part = piece.part(at, stop)
            cache.hits[key] += part.num_rows
            if part.num_rows:
                yield part
            at = stop
            continue
        upto = min(high, cache.next_low(key, at) or high)
        start = at
        for rows, offsets, reached in consume(at, upto):
            cache.misses[key] += rows.num_rows
            cache.add(key, Piece(start, reached, rows, offsets))
            start = reached
            if rows.num_rows:
                yield rows
        at = upto
