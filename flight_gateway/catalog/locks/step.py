"""One attempt to take a lock, in one write transaction (the portable form; Postgres runs the
same step as one function call, see ``locks.postgres``).

The queue: a request that cannot be granted may leave a waiting row whose ``seq`` orders it.
Waiting requests take their place in each source's queue in one order of source names, as
if they locked the sources one by one in that order (so no two can wait for each other): a
waiting request holds its place in the queue of every source up to the first one it waits
for, and none after it (``reserved``). A later request never overtakes an earlier one in the
queue of a source they share; it may take a source the earlier one has not reached yet. A
move waiting for its cold source behind that source's writers so leaves its hot source's
writers alone until it is next in line for the cold one: before, every writer of the hot
source queued behind the move, and so behind every writer of the cold source (tens of seconds
under load). Waiting rows expire after a heartbeat, so a waiter that died frees its place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, delete, insert, select, update

from flight_gateway.catalog import db
from flight_gateway.catalog.db import locks, sources, tables
from flight_gateway.catalog.in_force import alive_at
from flight_gateway.catalog.model import LockGrant
from flight_gateway.catalog.queries import table_row

WAITER_HEARTBEAT_S = 2.0


@dataclass(frozen=True)
class StepResult:
    granted: LockGrant | None = None
    #: Requested sources that are not in the table.
    missing: tuple[str, ...] = ()
    #: Who holds or waits for a requested source ahead of this request.
    blockers: tuple[str, ...] = ()


@dataclass(frozen=True)
class LockAsk:
    table: str
    lock_id: str
    owner: str
    sources: tuple[str, ...]
    ttl_s: float


def _grant(
    conn: Connection, t: Row[Any], ask: LockAsk, mine: Row[Any] | None, now: float
) -> LockGrant:
    token = int(t.next_fencing_token)
    conn.execute(update(tables).where(tables.c.id == t.id).values(next_fencing_token=token + 1))
    values = {
        "granted": True,
        "fencing_token": token,
        "expires_at": now + ask.ttl_s,
        "ttl_s": ask.ttl_s,
    }
    if mine is not None:
        conn.execute(update(locks).where(locks.c.lock_id == ask.lock_id).values(**values))
    else:
        conn.execute(
            insert(locks).values(
                lock_id=ask.lock_id,
                table_id=t.id,
                owner=ask.owner,
                sources=list(ask.sources),
                **values,
            )
        )
    return LockGrant(ask.lock_id, ask.table, ask.sources, ask.owner, token, now + ask.ttl_s)


def _enqueue(
    conn: Connection, t: Row[Any], ask: LockAsk, mine: Row[Any] | None, now: float
) -> None:
    beat = now + WAITER_HEARTBEAT_S
    if mine is not None:
        conn.execute(update(locks).where(locks.c.lock_id == ask.lock_id).values(expires_at=beat))
        return
    conn.execute(
        insert(locks).values(
            lock_id=ask.lock_id,
            table_id=t.id,
            owner=ask.owner,
            sources=list(ask.sources),
            granted=False,
            expires_at=beat,
            ttl_s=ask.ttl_s,
        )
    )


def lock_step(conn: Connection, ask: LockAsk, enqueue: bool) -> StepResult:
    """Grant ``ask`` if nothing blocks it; else (if ``enqueue``) keep its place in the queue."""
    t = table_row(conn, ask.table, for_update=True)
    now = db.db_now(conn)
    conn.execute(delete(locks).where(locks.c.table_id == t.id, locks.c.expires_at <= now))
    present = conn.execute(
        select(sources.c.name).where(
            sources.c.table_id == t.id,
            alive_at(t.current_version),
            sources.c.name.in_(ask.sources),
        )
    ).scalars()
    missing = set(ask.sources) - set(present)
    if missing:
        return StepResult(missing=tuple(sorted(missing)))
    rows = conn.execute(select(locks).where(locks.c.table_id == t.id).order_by(locks.c.seq)).all()
    mine = next((r for r in rows if r.lock_id == ask.lock_id), None)
    others = [r for r in rows if r.lock_id != ask.lock_id]
    ahead = [r for r in others if not r.granted and (mine is None or r.seq < mine.seq)]
    blockers = [r for r, claim in _claims(others, ahead) if claim & set(ask.sources)]
    if not blockers:
        return StepResult(granted=_grant(conn, t, ask, mine, now))
    if enqueue:
        _enqueue(conn, t, ask, mine, now)
    who = {f"{r.owner} ({'holds' if r.granted else 'waits'})" for r in blockers}
    return StepResult(blockers=tuple(sorted(who)))


def reserved(sources: Sequence[str], taken: set[str]) -> list[str]:
    """The sources a waiting request holds its place for: in name order, up to and including
    the first one ``taken`` (held, or reserved by a request ahead of it)."""
    out = []
    for source in sorted(sources):
        out.append(source)
        if source in taken:
            break
    return out


def _claims(
    others: Sequence[Row[Any]], ahead: Sequence[Row[Any]]
) -> list[tuple[Row[Any], set[str]]]:
    """Each holder and each waiter queued ahead (``ahead``, in queue order) with the sources
    it keeps from a new request: a holder all of its own, a waiter those it ``reserved``."""
    out = [(r, set(r.sources)) for r in others if r.granted]
    taken = set().union(*(claim for _, claim in out))
    for r in ahead:
        claim = set(reserved(r.sources, taken))
        taken |= claim
        out.append((r, claim))
    return out
