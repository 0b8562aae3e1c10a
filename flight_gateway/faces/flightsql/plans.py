"""What statements reuse of a pinned version (DESIGN §17: a pinned version never changes).

- ``types``: a statement's result schema, keyed by its SQL and the schema (table id, schema
  id) of each table it reads: typing binds the statement in a worker process (a round trip and
  DuckDB's binder), and its answer depends on the tables' columns only, not on their rows.
- ``relations``: a table planned for the engine at a pinned version (its sources' pinned file
  lists with their column mappings, PostgreSQL queries, streams opened lazily), keyed by table
  id, version and the filter that pruned it: planned over all its columns (its hot sources
  sliced) once, then narrowed to the columns each statement uses (those are cached too). A
  table with a source still read from its server or as a stream is planned per column set:
  the columns decide what that source reads. Permissions are whole tables (checked before
  either cache is asked), so what a caller may read is the table.
- ``parsed``: a statement's text without parameters, parsed: the SQL its handle carries and
  the tables it names (with their ``FOR VERSION``/``TIMESTAMP AS OF`` pins). Permissions and
  pins are still checked and taken for every statement.
- ``prepared``: a handle's statement parsed again with the columns and filters each table
  reference needs, keyed by the handle's SQL, pinned versions, table ids and schema ids (all a
  function of those: no row enters it). Shared read-only by the statements that hit it.
- ``rewritten``: a statement as its worker runs it (its tables replaced by the views of its
  relations) after DuckDB's own parse checked it, keyed by the handle's SQL and which view each
  table reference reads. A function of those two alone: no table state enters it.
- ``footers`` (``engine.FOOTERS``): the top-level columns of a Parquet file, keyed by its path,
  size and modification time: relations of other filters or versions over the same files
  reuse them.

- ``results``: the rows of a deterministic statement (``query.deterministic``: only functions
  DuckDB calls consistent, no ``now()``, ``random()`` or sampling), keyed by its SQL with its
  parameters bound and the table id, pinned version and schema id of each table it reads: a
  function of those alone. Kept when its stream ended whole and it was small enough
  (``limits.sql_result_cache_mb``, one result at most an eighth of it). A later statement with
  the same key is still checked for permissions and pins (an expired version or a dropped table
  fails as before) and holds its slots, but runs no worker.

All are bounded LRUs (entries; relations also by the files they list, results by their bytes)
and count hits and misses (``harness_sql_cache``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

import pyarrow as pa

from flight_gateway.core.metrics import SQL_CACHE

V = TypeVar("V")


class Lru(Generic[V]):
    """At most ``entries`` values of total ``weight`` at most ``max_weight``."""

    def __init__(
        self, name: str, entries: int, max_weight: int, weigh: Callable[[V], int] = lambda _: 1
    ) -> None:
        self.name, self.entries, self.max_weight, self.weigh = name, entries, max_weight, weigh
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        """The value of ``key``, made by ``make`` (outside the lock) on a miss."""
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                self.hits += 1
        if hit is not None:
            SQL_CACHE.labels(self.name, "hit").inc()
            return hit[0]
        value = make()
        weight = self.weigh(value)
        with self._lock:
            self.misses += 1
            if weight <= self.max_weight and key not in self._items:
                self._items[key] = (value, weight)
                self._weight += weight
                while len(self._items) > self.entries or self._weight > self.max_weight:
                    _, (_, w) = self._items.popitem(last=False)
                    self._weight -= w
        SQL_CACHE.labels(self.name, "miss").inc()
        return value

    def peek(self, key: Hashable) -> V | None:
        """The value of ``key`` if cached (counted as a hit or a miss); see ``add``."""
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                self.hits += 1
            else:
                self.misses += 1
        SQL_CACHE.labels(self.name, "hit" if hit is not None else "miss").inc()
        return None if hit is None else hit[0]

    def __contains__(self, key: Hashable) -> bool:
        """Whether ``key`` is cached (not counted, the order unchanged)."""
        with self._lock:
            return key in self._items

    def add(self, key: Hashable, value: V) -> None:
        """Cache ``value`` made after a ``peek`` missed."""
        weight = self.weigh(value)
        with self._lock:
            if weight > self.max_weight or key in self._items:
                return
            self._items[key] = (value, weight)
            self._weight += weight
            while len(self._items) > self.entries or self._weight > self.max_weight:
                _, (_, w) = self._items.popitem(last=False)
                self._weight -= w

    def put(self, key: Hashable, value: V) -> None:
        """Replace the value of ``key`` (kept only if it is still cached)."""
        with self._lock:
            old = self._items.get(key)
            if old is not None:
                weight = self.weigh(value)
                self._items[key] = (value, weight)
                self._weight += weight - old[1]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "entries": len(self._items)}


class Results:
    """Kept statement results (the module's ``results``), at most ``capacity`` bytes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.largest = capacity // 8
        self.lru: Lru[pa.Table] = Lru("results", 4096, capacity, weigh=lambda t: t.nbytes)

    def peek(self, key: Hashable) -> pa.Table | None:
        return self.lru.peek(key)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.lru

    def keeping(self, key: Hashable, reader: pa.RecordBatchReader) -> pa.RecordBatchReader:
        """``reader``'s batches, kept as ``key``'s result once the stream ended whole: a
        stream that failed, was cancelled or was left early is not kept."""

        def batches() -> Iterator[pa.RecordBatch]:
            kept: list[pa.RecordBatch] | None = []
            size = 0
            for batch in reader:
                if kept is not None:
                    size += batch.nbytes
                    if size > self.largest:
                        kept = None
                    else:
                        kept.append(batch)
                yield batch
            if kept is not None:
                self.lru.add(key, pa.Table.from_batches(kept, reader.schema))

        return pa.RecordBatchReader.from_batches(reader.schema, batches())

    def stats(self) -> dict[str, int]:
        return self.lru.stats()
