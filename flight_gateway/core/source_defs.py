"""What the sources of a table are (kind, config, partition), cached for commit checks.

A commit that updates source states is checked against each source's kind and config before it
is applied (``sources.check_commit``). A source's definition never changes after it is added,
so asking the catalog for it on every commit is a round trip spent on a known answer. Only a
source removed and re-added under the same name gets a new definition: this gateway forgets a
table's entries whenever it commits an add or remove on it, and entries expire after ``ttl_s``
so a change made through another replica is seen soon. The read path binds sources from the
pinned snapshot and checks them again, so a stale entry can never widen what a read reaches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from flight_gateway.catalog import Catalog
from flight_gateway.catalog.model import SourceDef

MAX_ENTRIES = 100_000


class SourceDefCache:
    def __init__(self, catalog: Catalog, ttl_s: float = 2.0) -> None:
        self._catalog = catalog
        self._ttl_s = ttl_s
        self._mutex = threading.Lock()
        self._entries: dict[tuple[str, str], tuple[float, SourceDef]] = {}

    def get(self, table: str, names: Sequence[str]) -> dict[str, SourceDef]:
        now = time.monotonic()
        found: dict[str, SourceDef] = {}
        with self._mutex:
            for n in names:
                e = self._entries.get((table, n))
                if e is not None and e[0] > now:
                    found[n] = e[1]
        missing = [n for n in names if n not in found]
        if missing:
            fresh = self._catalog.live_sources(table, missing)
            with self._mutex:
                if len(self._entries) > MAX_ENTRIES:
                    self._entries.clear()
                for n, d in fresh.items():
                    self._entries[(table, n)] = (now + self._ttl_s, d)
            found.update(fresh)
        return found

    def forget(self, table: str) -> None:
        with self._mutex:
            for key in [k for k in self._entries if k[0] == table]:
                del self._entries[key]
