"""Idle connections to PostgreSQL, kept for the next read (``ADBC``) or plan (``PLANNING``,
psycopg) of the same DSN.

Opening one costs a TCP and authentication round trip and, in the ADBC driver, a query of the
server's type catalogue for each new database handle: 80-100 ms of a 1,000-row read when every
plan and read connected (10 reads/s from one client; 100 with the pool, ``bench_hot_sources``),
and 8 % of read time under 80 concurrent clients. A read takes a connection (``take``) and
gives it back (``give``) only when its stream ended normally. One whose stream was closed early may be in the middle of a
COPY, and one whose statement failed may be broken: those are closed, never pooled.

Connections are in autocommit mode, so an idle one holds no transaction. One idle for longer
than ``idle_s`` is closed by a sweeper thread rather than reused (servers, poolers and
firewalls drop idle connections, and an operator dropping a database should not meet the
gateway's idle sessions for long). A pooled connection the server dropped all the same fails
its first statement: ``attempt`` then runs the work again on a fresh one. ADBC connections come
from one driver database per DSN (``databases``); work that meets a type that database did not
know raises ``Renewed``, and runs again on a connection of a new one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class Renewed(Exception):
    """Raised by a pool's work: the connection's view of the server is out of date and was
    renewed (``databases.Databases.renew``); ``attempt`` runs the work again on a new
    connection, ``RENEWALS`` times at most (another read may have renewed it a moment before
    with a view already too old)."""


RENEWALS = 3


def close_quietly(con: Any) -> None:
    try:
        con.close()
    except Exception:  # closing a connection the server already dropped
        log.debug("closing a PostgreSQL connection failed", exc_info=True)


class ConnectionPool:
    """Idle connections (made by ``connect(dsn)``) for each of at most ``max_dsns`` DSNs: as
    many as the DSN's reads in flight at their recent peak, at least ``per_dsn``, at most
    ``ceiling(connection)`` (a share of the server's ``max_connections``). A fixed 8 made 64
    concurrent readers connect again on most reads (8-12 % of DoGet samples under load)."""

    def __init__(
        self,
        connect: Callable[[str], Any],
        per_dsn: int = 8,
        max_dsns: int = 64,
        idle_s: float = 15.0,
        ceiling: Callable[[Any], int] | None = None,
    ) -> None:
        self.connect = connect
        self.per_dsn = per_dsn
        self.max_dsns = max_dsns
        self.idle_s = idle_s
        self.ceiling = ceiling
        self._idle: OrderedDict[str, list[tuple[float, Any]]] = OrderedDict()
        self._out: dict[str, int] = {}  # connections taken and not yet given back or closed
        self._peak: dict[str, int] = {}  # the most taken at once since the last sweep
        self._caps: dict[str, int] = {}
        self._lock = threading.Lock()
        self._sweeper: threading.Thread | None = None

    def keep(self, dsn: str) -> int:
        """How many idle connections to ``dsn`` the pool keeps now."""
        with self._lock:
            return self._keep(dsn)

    def _keep(self, dsn: str) -> int:
        # called with the lock held
        want = max(self.per_dsn, self._peak.get(dsn, 0))
        return min(want, self._caps.get(dsn, want))

    def _returned(self, dsn: str) -> None:
        # called with the lock held
        self._out[dsn] = max(0, self._out.get(dsn, 0) - 1)

    def discard(self, dsn: str, con: Any) -> None:
        """Close ``con`` instead of giving it back (its stream ended early or failed)."""
        with self._lock:
            self._returned(dsn)
        close_quietly(con)

    def _learn_cap(self, dsn: str, con: Any) -> None:
        if self.ceiling is None or dsn in self._caps:
            return
        try:
            cap = max(1, int(self.ceiling(con)))
        except Exception:  # a server that does not say: the floor
            log.debug("no connection ceiling for a PostgreSQL server", exc_info=True)
            cap = self.per_dsn
        with self._lock:
            self._caps[dsn] = cap

    def take(self, dsn: str) -> tuple[Any, bool]:
        """(connection, fresh): an idle connection to ``dsn`` if there is a recent one, else a
        new one (``fresh``). Reads in flight are not bounded here: a read waiting for another's
        connection made writers (whose commits check the table through this pool) wait behind
        readers' streams (commit p50 4 -> 10 s under 64 readers)."""
        now = time.monotonic()
        stale: list[Any] = []
        con = None
        with self._lock:
            idle = self._idle.get(dsn, [])
            while idle and con is None:
                since, candidate = idle.pop()  # the most recently used: likeliest alive
                if now - since <= self.idle_s:
                    con = candidate
                else:
                    stale.append(candidate)
            out = self._out[dsn] = self._out.get(dsn, 0) + 1
            self._peak[dsn] = max(self._peak.get(dsn, 0), out)
        for c in stale:
            close_quietly(c)
        if con is not None:
            return con, False
        try:
            con = self.connect(dsn)
        except BaseException:
            with self._lock:
                self._returned(dsn)
            raise
        self._learn_cap(dsn, con)
        return con, True

    def attempt(
        self, dsn: str, work: Callable[[Any], T], own: tuple[type[Exception], ...] = ()
    ) -> tuple[T, Any]:
        """(``work(connection)``, the connection) on a pooled connection, for the caller to
        ``give`` back when done with it. If ``work`` fails on a pooled (not fresh) connection
        it runs once more on a fresh one: the server may have dropped the idle one. Errors of
        the ``own`` types are the caller's (the query's answer, not the connection's) and are
        raised at once. A connection whose work failed is closed."""
        renewals = 0
        while True:
            con, fresh = self.take(dsn)
            try:
                return work(con), con
            except Exception as e:
                self.discard(dsn, con)
                if isinstance(e, Renewed) and renewals < RENEWALS:
                    renewals += 1
                    self.clear(dsn)  # the idle ones share the connection's old view
                    continue
                if fresh or isinstance(e, own):
                    raise
                log.info(
                    "a pooled PostgreSQL connection failed (%s): retrying on a new one",
                    type(e).__name__,
                )

    def run(self, dsn: str, work: Callable[[Any], T], own: tuple[type[Exception], ...] = ()) -> T:
        """``work(connection)`` as ``attempt`` runs it, the connection given back after."""
        out, con = self.attempt(dsn, work, own)
        self.give(dsn, con)
        return out

    def give(self, dsn: str, con: Any) -> None:
        """Keep ``con`` for the next read of ``dsn`` (the caller's statement ended normally)."""
        surplus: list[Any] = []
        with self._lock:
            self._returned(dsn)
            idle = self._idle.setdefault(dsn, [])
            self._idle.move_to_end(dsn)
            idle.append((time.monotonic(), con))
            while len(idle) > self._keep(dsn):
                surplus.append(idle.pop(0)[1])
            while len(self._idle) > self.max_dsns:
                surplus.extend(c for _, c in self._idle.popitem(last=False)[1])
            self._start_sweeper()
        for c in surplus:
            close_quietly(c)

    def idle_count(self, dsn: str | None = None) -> int:
        with self._lock:
            if dsn is not None:
                return len(self._idle.get(dsn, []))
            return sum(len(v) for v in self._idle.values())

    def clear(self, dsn: str | None = None) -> None:
        """Close every idle connection (to ``dsn`` only, if given)."""
        with self._lock:
            if dsn is None:
                cons = [c for idle in self._idle.values() for _, c in idle]
                self._idle.clear()
            else:
                cons = [c for _, c in self._idle.pop(dsn, [])]
        for c in cons:
            close_quietly(c)

    def sweep(self) -> int:
        """Close the connections idle for longer than ``idle_s``; how many."""
        cutoff = time.monotonic() - self.idle_s
        stale: list[Any] = []
        with self._lock:
            for dsn in list(self._idle):
                idle = self._idle[dsn]
                stale.extend(c for since, c in idle if since < cutoff)
                idle[:] = [(since, c) for since, c in idle if since >= cutoff]
                if not idle:
                    del self._idle[dsn]
            for dsn in list(self._peak):  # the peak follows demand down, one sweep behind
                self._peak[dsn] = self._out.get(dsn, 0)
        for c in stale:
            close_quietly(c)
        return len(stale)

    def _start_sweeper(self) -> None:
        # called with the lock held
        if self._sweeper is not None and self._sweeper.is_alive():
            return
        self._sweeper = threading.Thread(target=self._sweep_loop, name="pg-pool-sweep", daemon=True)
        self._sweeper.start()

    def _sweep_loop(self) -> None:
        # runs while anything is idle; the next give starts it again
        while True:
            time.sleep(max(self.idle_s / 3, 0.05))
            self.sweep()
            with self._lock:
                if not self._idle:
                    self._sweeper = None
                    return


def connect_adbc(dsn: str) -> Any:
    from planners.postgres.databases import DATABASES

    return DATABASES.connect(dsn)


def connect_psycopg(dsn: str) -> Any:
    import psycopg

    return psycopg.connect(dsn, autocommit=True, connect_timeout=10)


def server_share(con: Any) -> int:
    """An eighth of the server's connections left to clients: what one pool of the gateway
    (reads, planning) keeps idle to one server at most. Its catalog often lives on the same
    server and takes tens of connections under load (64 readers and 16 writers: up to 58 of a
    default server's 97); a quarter for each pool left bursts of new connections refused ("too
    many clients"), failing catalog calls."""
    cur = con.cursor()
    try:
        cur.execute(
            "SELECT current_setting('max_connections')::int"
            " - current_setting('superuser_reserved_connections')::int"
        )
        row = cur.fetchone()
    finally:
        cur.close()
    return int(row[0]) // 8 if row else 0


#: reads' connections (ADBC: Arrow out of COPY)
ADBC = ConnectionPool(connect_adbc, ceiling=server_share)
#: planners' connections (psycopg: key ranges, estimates)
PLANNING = ConnectionPool(connect_psycopg, ceiling=server_share)
