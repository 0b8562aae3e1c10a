"""Apply a group of commits to one table in one transaction with SQLAlchemy Core.

This is how every commit is applied on SQLite (inside one ``BEGIN IMMEDIATE``) and how commits
that change the schema are applied on Postgres. The group's checks read the table with a
handful of statements up front; the group's state is then kept in memory as each commit
applies, and the writes of all commits go out as a few ``executemany`` statements at the end.
Each commit runs all of its checks before it records any write, so a commit that fails a check
leaves nothing behind and its neighbours still apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Row, bindparam, insert, or_, select, update

from flight_gateway.catalog import db
from flight_gateway.catalog.commit.request import CommitRequest
from flight_gateway.catalog.conflicts import check_failed
from flight_gateway.catalog.db import kv, locks, schemas, source_states, sources, tables, versions
from flight_gateway.catalog.in_force import sources_at
from flight_gateway.catalog.locks.fencing import check_locks
from flight_gateway.catalog.model import CommitResult
from flight_gateway.catalog.queries import load_schema, table_row
from flight_gateway.catalog.schema import evolve
from flight_gateway.catalog.validation import new_id
from flight_gateway.protocol.errors import HarnessError

Outcome = CommitResult | HarnessError


@dataclass
class _Live:
    id: int
    state_version: int


@dataclass
class _Group:
    """The table as the group's checks see it, kept current as each commit applies."""

    table: Row[Any]
    version: int
    schema_id: int
    last_field_id: int
    committed_at: float
    clock: float
    done: dict[str, tuple[int, int]]
    live: dict[str, _Live]
    held: list[Any]


@dataclass
class _Writes:
    versions: list[dict[str, Any]] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)
    key_values: list[dict[str, Any]] = field(default_factory=list)
    removals: list[dict[str, Any]] = field(default_factory=list)

    def flush(self, conn: Connection) -> None:
        if self.versions:
            conn.execute(insert(versions), self.versions)
        if self.states:
            conn.execute(insert(source_states), self.states)
        if self.key_values:
            conn.execute(insert(kv), self.key_values)
        if self.removals:
            conn.execute(
                update(sources)
                .where(sources.c.id == bindparam("sid"))
                .values(removed_version=bindparam("rv")),
                self.removals,
            )


def _load(conn: Connection, t: Row[Any], batch: Sequence[CommitRequest], clock: float) -> _Group:
    ids = sorted({r.commit_id for r in batch})
    rows = conn.execute(
        select(
            versions.c.version, versions.c.schema_id, versions.c.committed_at, versions.c.commit_id
        ).where(
            versions.c.table_id == t.id,
            or_(versions.c.version == t.current_version, versions.c.commit_id.in_(ids)),
        )
    ).all()
    prev = next(r for r in rows if r.version == t.current_version)
    names = sorted({n for r in batch for n in [*r.touched, *(a.name for a in r.adds)]})
    live = conn.execute(sources_at(t.id, t.current_version).where(sources.c.name.in_(names))).all()
    held = conn.execute(
        select(locks.c.lock_id, locks.c.owner, locks.c.sources, locks.c.fencing_token).where(
            locks.c.table_id == t.id, locks.c.granted.is_(True), locks.c.expires_at > clock
        )
    ).all()
    return _Group(
        table=t,
        version=int(t.current_version),
        schema_id=int(prev.schema_id),
        last_field_id=int(t.last_field_id),
        # Commit times never go backwards, so as_of lookups are unambiguous.
        committed_at=max(clock, float(prev.committed_at)),
        clock=clock,
        done={r.commit_id: (int(r.version), int(r.schema_id)) for r in rows if r.commit_id in ids},
        live={r.name: _Live(int(r.id), int(r.state_version)) for r in live},
        held=list(held),
    )


def _check(g: _Group, r: CommitRequest) -> None:
    name = g.table.name
    check_locks(g.held, name, r.touched, r.lock_id, r.fencing_token)
    for n in r.touched:
        if n not in g.live:
            raise check_failed("no_source", name, {"source": n})
    for u in r.updates:
        cur = g.live[u.source].state_version
        if u.expect_state_version is not None and u.expect_state_version != cur:
            raise check_failed(
                "cas",
                name,
                {"source": u.source, "current": cur, "expected": u.expect_state_version},
            )
    cols = set(g.table.partition_by)
    for a in r.adds:
        if a.name in g.live:
            raise check_failed("source_exists", name, {"source": a.name})
        bad = set(a.partition) - cols
        if bad:
            raise check_failed(
                "bad_partition", name, {"source": a.name, "keys": bad, "partition_by": cols}
            )


def _new_schema(conn: Connection, g: _Group, r: CommitRequest, version: int) -> int:
    """Evolve the schema (raising before anything is written if a change is invalid)."""
    if not r.schema_changes:
        return g.schema_id
    t = g.table
    nxt = evolve(
        load_schema(conn, t.id, g.schema_id),
        r.schema_changes,
        protected=list(t.partition_by) + list(t.primary_key),
        last_field_id=g.last_field_id,
    )
    conn.execute(
        insert(schemas).values(
            table_id=t.id,
            schema_id=nxt.schema_id,
            fields=[f.to_json() for f in nxt.fields],
            added_version=version,
        )
    )
    g.last_field_id = max(g.last_field_id, nxt.last_field_id)
    return nxt.schema_id


def _record(conn: Connection, g: _Group, r: CommitRequest, version: int, w: _Writes) -> None:
    t = g.table
    for a in r.adds:  # inserted at once: later commits of the group may update the new source
        sid = new_id(
            conn.execute(
                insert(sources).values(
                    table_id=t.id,
                    name=a.name,
                    kind=a.kind,
                    config=dict(a.config),
                    partition=dict(a.partition),
                    added_version=version,
                )
            )
        )
        w.states.append(
            {"source_id": sid, "version": version, "state": dict(a.state), "state_version": 1}
        )
        g.live[a.name] = _Live(sid, 1)
    for u in r.updates:
        live = g.live[u.source]
        live.state_version += 1
        w.states.append(
            {
                "source_id": live.id,
                "version": version,
                "state": dict(u.state),
                "state_version": live.state_version,
            }
        )
    for n in r.removes:
        w.removals.append({"sid": g.live.pop(n).id, "rv": version})
    for ns, key, value in r.key_values:
        w.key_values.append(
            {"table_id": t.id, "ns": ns, "key": key, "version": version, "value": value}
        )


def _apply_one(conn: Connection, g: _Group, r: CommitRequest, w: _Writes) -> CommitResult:
    done = g.done.get(r.commit_id)
    if done is not None:
        return CommitResult(done[0], False, done[1])
    _check(g, r)
    version = g.version + 1
    schema_id = _new_schema(conn, g, r, version)
    w.versions.append(
        {
            "table_id": g.table.id,
            "version": version,
            "committed_at": g.committed_at,
            "commit_id": r.commit_id,
            "schema_id": schema_id,
            "summary": dict(r.summary),
        }
    )
    _record(conn, g, r, version, w)
    g.version, g.schema_id = version, schema_id
    g.done[r.commit_id] = (version, schema_id)
    return CommitResult(version, True, schema_id)


def apply_group(conn: Connection, table: str, batch: Sequence[CommitRequest]) -> list[Outcome]:
    """Apply ``batch`` in order, each as its own version; one outcome per commit.

    ``conn`` is inside a write transaction.
    """
    t = table_row(conn, table, for_update=True)
    g = _load(conn, t, batch, db.db_now(conn))
    w = _Writes()
    out: list[Outcome] = []
    for r in batch:
        try:
            out.append(_apply_one(conn, g, r, w))
        except HarnessError as e:
            out.append(e)
    w.flush(conn)
    if g.version != t.current_version:
        conn.execute(
            update(tables)
            .where(tables.c.id == t.id)
            .values(current_version=g.version, last_field_id=g.last_field_id)
        )
    return out
