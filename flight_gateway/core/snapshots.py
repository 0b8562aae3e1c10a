"""Descriptions of table versions, shared by the calls of one gateway.

A version never changes once committed, so its description (schema, properties, every
source's state: one catalog statement, ``Catalog.describe_at``) is read once and kept, keyed by
the table's id (its incarnation), never its name. Each use still asks the catalog for the table's head (one
primary-key lookup): which incarnation the name is now, its latest version and which versions
it keeps. Readers pin versions through it; writers read the latest version through it too,
before and under their lease: under a read load a describe took ~0.4 s of a DoPut (Python
competing for the GIL), and the version a writer finds is usually one a reader already pinned.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from flight_gateway.catalog import Catalog, TableSnapshot

#: Versions kept (each holds every source state of its table).
KEPT = 128


class Snapshots:
    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._cache: OrderedDict[tuple[int, int], TableSnapshot] = OrderedDict()
        self._lock = threading.Lock()

    def at(self, table: str, version: int, table_id: int) -> TableSnapshot:
        """Version ``version`` of incarnation ``table_id`` of ``table`` (checked against a head
        the caller read)."""
        with self._lock:
            hit = self._cache.get((table_id, version))
            if hit is not None:
                self._cache.move_to_end((table_id, version))
                return hit
        snap = self._catalog.describe_at(table, table_id, version)
        with self._lock:
            self._cache[(snap.table_id, snap.version)] = snap
            while len(self._cache) > KEPT:
                self._cache.popitem(last=False)
        return snap

    def latest(self, table: str) -> TableSnapshot:
        """The table's latest version, as ``catalog.describe(table)`` reads it."""
        head = self._catalog.head(table)
        return self.at(table, head.current_version, head.table_id)

    def latest_unless_done(
        self, table: str, commit_ids: Sequence[str]
    ) -> tuple[TableSnapshot | None, dict[str, int]]:
        """Which of ``commit_ids`` were applied (with their versions) and, unless all were,
        the table's latest version: a writer's first question and its next, with the head
        read in the same statement as the commits."""
        head, done = self._catalog.head_with_commits(table, commit_ids)
        if all(c in done for c in commit_ids):
            return None, done
        return self.at(table, head.current_version, head.table_id), done
