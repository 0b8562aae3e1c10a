"""Warm DuckDB databases for statements, so opening one is off the statement's path.

A statement needs a fresh DuckDB database (its configuration ends locked and the caller's SQL
has run on it: it is never reused). Creating one takes about 10 ms, and attaching a PostgreSQL
server with DuckDB's postgres extension about 80 ms (the extension reads the server's catalog).
The pool keeps one spare database per set of servers recently used, prepared by a background
thread right after the previous one was taken; a spare older than ``idle_s`` is dropped (its
server connections may have gone stale). Spares hold resolved DSNs in memory only, keyed by the
exact DSNs, so one is only ever used for the servers it was made for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from flight_gateway.flightsql.engine import SqlLimits, connect

log = logging.getLogger(__name__)


class WarmPool:
    def __init__(self, limits: SqlLimits, max_keys: int = 16, idle_s: float = 60.0) -> None:
        self.limits = limits
        self.max_keys, self.idle_s = max_keys, idle_s
        self._spares: OrderedDict[tuple[str, ...], tuple[float, Any]] = OrderedDict()
        self._making: set[tuple[str, ...]] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        threading.Thread(target=self._sweep, daemon=True, name="duckdb-spares").start()

    def _sweep(self) -> None:
        """Drop spares nobody took within ``idle_s`` (they hold server connections)."""
        while not self._stop.wait(self.idle_s / 2):
            now, stale = time.monotonic(), []
            with self._lock:
                for key, (made, con) in list(self._spares.items()):
                    if now - made > self.idle_s:
                        stale.append(con)
                        del self._spares[key]
            for con in stale:
                _close(con)

    def take(self, dsns: Sequence[str]) -> Any:
        """A database with ``dsns`` attached as ``__pg_<i>`` (a spare, else made now)."""
        key = tuple(dsns)
        with self._lock:
            spare = self._spares.pop(key, None)
        con = None
        if spare is not None:
            made, con = spare
            if time.monotonic() - made > self.idle_s:
                _close(con)
                con = None
        if con is None:
            con = connect(self.limits, key)
        self._refill(key)
        return con

    def _refill(self, key: tuple[str, ...]) -> None:
        with self._lock:
            if self._closed or key in self._making or key in self._spares:
                return
            self._making.add(key)
        threading.Thread(target=self._make, args=(key,), daemon=True).start()

    def _make(self, key: tuple[str, ...]) -> None:
        try:
            con = connect(self.limits, key)
        except Exception as e:  # the statement that needs it will report the failure itself
            log.debug("no spare DuckDB database: %s", type(e).__name__)
            with self._lock:
                self._making.discard(key)
            return
        evicted = []
        with self._lock:
            self._making.discard(key)
            if self._closed:
                evicted.append(con)
            else:
                self._spares[key] = (time.monotonic(), con)
                while len(self._spares) > self.max_keys:
                    evicted.append(self._spares.popitem(last=False)[1][1])
        for old in evicted:
            _close(old)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._closed = True
            spares = [c for _, c in self._spares.values()]
            self._spares.clear()
        for con in spares:
            _close(con)


def _close(con: Any) -> None:
    try:
        con.close()
    except Exception:  # a broken spare: nothing left to release
        log.debug("closing a spare DuckDB database failed", exc_info=True)
