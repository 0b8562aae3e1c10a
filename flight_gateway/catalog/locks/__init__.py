"""Lease locks on sources: all or nothing, a fair waiting queue, renewal, fencing tokens.

On Postgres every lock operation is one statement on an autocommit connection (a lock step is
one call of ``harness_lock_step``), so taking, renewing and releasing a lock cost one round
trip each.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, delete, select, update

from flight_gateway.catalog import db
from flight_gateway.catalog.db import locks, read_tx, tables, write_tx
from flight_gateway.catalog.locks.step import WAITER_HEARTBEAT_S, LockAsk, StepResult, lock_step
from flight_gateway.catalog.model import LockGrant, LockInfo
from flight_gateway.catalog.validation import as_list, check_ttl, is_number
from flight_gateway.protocol.errors import InvalidArgument, LockExpired, LockUnavailable, NotFound

log = logging.getLogger(__name__)


_LOCK_STEP = "SELECT harness_lock_step(%s, %s, %s, %s::jsonb, %s, %s, %s)"


def _pg_step(engine: Engine, ask: LockAsk, enqueue: bool) -> StepResult:
    params = (
        ask.table,
        ask.lock_id,
        ask.owner,
        json.dumps(list(ask.sources)),
        ask.ttl_s,
        enqueue,
        WAITER_HEARTBEAT_S,
    )
    r = db.call_once_retried(engine, _LOCK_STEP, params)
    if "error" in r:
        raise NotFound(f"table {ask.table!r} does not exist")
    if "token" in r:
        grant = LockGrant(
            ask.lock_id, ask.table, ask.sources, ask.owner, int(r["token"]), float(r["expires_at"])
        )
        return StepResult(granted=grant)
    if "missing" in r:
        return StepResult(missing=tuple(r["missing"]))
    return StepResult(blockers=tuple(r["blockers"]))


#: Longest sleep between two tries of a waiting request. A release through this process wakes
#: its waiters at once (``_Releases``), so the polls are for releases elsewhere (other gateway
#: replicas, clients' own locks, expiries): at 0.1 s, 16 writers waiting made ~100 lock steps
#: a second, each taking the table's row lock in the catalog that commits take too.
POLL_CAP_S = 0.25


class _Releases:
    """Releases of locks taken through this process, per source: a request waiting here tries
    again as soon as a lock on one of its sources is released (or leaves the queue) instead
    of at its next poll. Only such a release can let it in: a grant takes sources, never frees
    any."""

    #: Lock ids remembered (a lock another process releases is never forgotten otherwise).
    KEPT = 4096

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation: dict[tuple[str, str], int] = {}
        self._locks: OrderedDict[str, tuple[str, Sequence[str]]] = OrderedDict()

    def generations(self, table: str, sources: Sequence[str]) -> tuple[int, ...]:
        with self._cond:
            return tuple(self._generation.get((table, s), 0) for s in sources)

    def taken(self, lock_id: str, table: str, sources: Sequence[str]) -> None:
        with self._cond:
            self._locks[lock_id] = (table, sources)
            while len(self._locks) > self.KEPT:
                self._locks.popitem(last=False)

    def forget(self, lock_id: str) -> None:
        with self._cond:
            self._locks.pop(lock_id, None)

    def released(self, lock_id: str) -> None:
        with self._cond:
            held = self._locks.pop(lock_id, None)
            if held is not None:
                table, sources = held
                for s in sources:
                    self._generation[table, s] = self._generation.get((table, s), 0) + 1
                self._cond.notify_all()

    def wait(
        self, table: str, sources: Sequence[str], since: tuple[int, ...], timeout: float
    ) -> None:
        """Until a lock on one of ``sources`` is released after ``generations`` gave ``since``,
        or ``timeout``."""
        with self._cond:
            self._cond.wait_for(lambda: self.generations(table, sources) != since, timeout)


class Locks:
    def __init__(
        self, engine: Engine, fast: Engine | None, *, poll_s: float, max_wait_s: float
    ) -> None:
        """``fast``: autocommit Postgres connections for one-statement operations, or None."""
        self._engine = engine
        self._fast = fast
        self._poll_s = poll_s
        self._max_wait_s = max_wait_s
        self._releases = _Releases()

    def _ask(
        self,
        table: str,
        source_names: Sequence[str],
        owner: str,
        ttl_s: float,
        wait_s: float,
        lock_id: str | None = None,
    ) -> LockAsk:
        names = as_list(source_names, "sources")
        if not names or not all(isinstance(s, str) and s for s in names):
            raise InvalidArgument("lock needs a non-empty list of source names")
        wanted = sorted(set(names))
        ttl = check_ttl(ttl_s)
        if not is_number(wait_s) or not 0 <= wait_s <= self._max_wait_s:
            raise InvalidArgument(f"wait_s must be in [0, {self._max_wait_s:g}], got {wait_s!r}")
        if not isinstance(owner, str) or not owner:
            raise InvalidArgument("lock owner must be a non-empty string")
        return LockAsk(table, lock_id or uuid.uuid4().hex, owner, tuple(wanted), ttl)

    def _step(self, ask: LockAsk, enqueue: bool) -> StepResult:
        if self._fast is not None:
            return _pg_step(self._fast, ask, enqueue)
        with write_tx(self._engine) as conn:
            return lock_step(conn, ask, enqueue)

    def lock(
        self,
        table: str,
        source_names: Sequence[str],
        owner: str,
        ttl_s: float,
        wait_s: float,
        lock_id: str | None = None,
    ) -> LockGrant:
        ask = self._ask(table, source_names, owner, ttl_s, wait_s, lock_id)
        deadline = time.monotonic() + float(wait_s)
        poll = self._poll_s
        queued = granted = False
        # Known before the first step: its release, or its leaving the queue, wakes waiters.
        self._releases.taken(ask.lock_id, table, ask.sources)
        try:
            while True:
                enqueue = time.monotonic() < deadline
                seen = self._releases.generations(table, ask.sources)
                res = self._step(ask, enqueue)
                if res.granted is not None:
                    queued = False  # the queue entry became the grant
                    granted = True
                    log.debug(
                        "lock %s on %s %s granted to %s", ask.lock_id, table, ask.sources, owner
                    )
                    return res.granted
                if res.missing:
                    raise NotFound(
                        f"cannot lock source(s) {list(res.missing)}: not in table {table!r}"
                    )
                if not enqueue:
                    raise LockUnavailable(
                        f"source(s) {list(ask.sources)} of table {table!r} are locked or queued by "
                        f"{', '.join(res.blockers)}"
                    )
                queued = True
                timeout = min(poll, max(deadline - time.monotonic(), 0.001))
                self._releases.wait(table, ask.sources, seen, timeout)
                poll = min(poll * 1.5, POLL_CAP_S)
        finally:
            if queued:
                self._leave_queue(ask.lock_id)
            if not granted:
                self._releases.forget(ask.lock_id)

    def _leave_queue(self, lock_id: str) -> None:
        try:
            self.unlock(lock_id)
        except Exception:  # best effort: the heartbeat expiry frees it anyway
            log.warning("could not remove queue entry of lock %s", lock_id, exc_info=True)

    @contextmanager
    def _one_statement(self) -> Iterator[Connection]:
        if self._fast is None:
            with write_tx(self._engine) as conn:
                yield conn
        else:
            with self._fast.connect() as conn:
                yield conn

    def renew(self, lock_id: str, ttl_s: float | None = None) -> float:
        ttl = None if ttl_s is None else check_ttl(ttl_s)
        with self._one_statement() as conn:
            now = db.clock(conn)
            new_ttl = locks.c.ttl_s if ttl is None else ttl
            expiry = conn.execute(
                update(locks)
                .where(
                    locks.c.lock_id == lock_id, locks.c.granted.is_(True), locks.c.expires_at > now
                )
                .values(expires_at=now + new_ttl, ttl_s=new_ttl)
                .returning(locks.c.expires_at)
            ).scalar()
        if expiry is None:
            raise LockExpired(f"lock {lock_id!r} has expired or was released; cannot renew")
        return float(expiry)

    def unlock(self, lock_id: str) -> None:
        with self._one_statement() as conn:
            conn.execute(delete(locks).where(locks.c.lock_id == lock_id))
        self._releases.released(lock_id)

    def list(self, table: str) -> list[LockInfo]:
        """The table's lock rows, granted and queued, in queue order (expired ones included
        until the next lock step removes them)."""
        with read_tx(self._engine) as conn:
            rows = conn.execute(
                select(locks, tables.c.name.label("table_name"))
                .join(tables, tables.c.id == locks.c.table_id)
                .where(tables.c.name == table)
                .order_by(locks.c.seq)
            ).all()
        return [_info(r) for r in rows]

    def info(self, lock_id: str) -> LockInfo | None:
        with read_tx(self._engine) as conn:
            r = conn.execute(
                select(locks, tables.c.name.label("table_name"))
                .join(tables, tables.c.id == locks.c.table_id)
                .where(locks.c.lock_id == lock_id)
            ).first()
        return None if r is None else _info(r)


def _info(r: Any) -> LockInfo:
    return LockInfo(
        lock_id=r.lock_id,
        table=r.table_name,
        owner=r.owner,
        sources=tuple(r.sources),
        granted=bool(r.granted),
        fencing_token=None if r.fencing_token is None else int(r.fencing_token),
        expires_at=float(r.expires_at),
    )
