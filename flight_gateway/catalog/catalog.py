"""The harness catalog: tables, sources, versioned source states, commits, locks, retention.

Every mutation is one database transaction that first takes the table's row lock (see ``db``),
so versions are gap-free and commits on disjoint sources queue instead of failing. Conflicts
are decided per source: compare-and-set on a source's ``state_version`` and source locks.
No external I/O happens inside a catalog transaction.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Row, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from flight_gateway.catalog import db
from flight_gateway.catalog.db import (
    kv,
    locks,
    read_tx,
    schemas,
    source_states,
    sources,
    tables,
    versions,
    write_tx,
)
from flight_gateway.catalog.model import (
    CommitInfo,
    CommitResult,
    LockGrant,
    SourceSnapshot,
    SourceSpec,
    SourceUpdate,
    TableSnapshot,
)
from flight_gateway.catalog.schema import Schema, evolve, new_schema
from flight_gateway.errors import (
    AlreadyExists,
    Conflict,
    InvalidArgument,
    LockExpired,
    LockUnavailable,
    NotFound,
)

log = logging.getLogger(__name__)

_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_][A-Za-z0-9_\-]*)*$")
_SOURCE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_WAITER_HEARTBEAT_S = 2.0


def _check_table_name(name: object) -> str:
    if not isinstance(name, str) or len(name) > 512 or not _TABLE_NAME.match(name):
        raise InvalidArgument(
            f"invalid table name {name!r}: use letters, digits, '_' or '-', optionally "
            "namespaced with '.' (e.g. 'ns.logs')"
        )
    return name


def _check_json(value: Any, what: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"{what} is not JSON-serialisable: {e}") from e


def _new_id(result: Any) -> int:
    """The primary key of the row an INSERT just made."""
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def _as_list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidArgument(f"{what} must be a list")
    return list(value)


class Catalog:
    """Harness catalog on a SQLAlchemy URL (``sqlite:///path`` or ``postgresql://...``)."""

    def __init__(self, url: str, *, lock_poll_s: float = 0.01) -> None:
        self.url = db.normalize_url(url)
        self.engine = db.make_engine(self.url)
        self._lock_poll_s = lock_poll_s
        db.migrate(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers

    def _table_row(self, conn: Connection, name: str, *, for_update: bool = False) -> Row[Any]:
        q = select(tables).where(tables.c.name == name)
        if for_update and conn.dialect.name == "postgresql":
            q = q.with_for_update()
        row = conn.execute(q).first()
        if row is None:
            raise NotFound(f"table {name!r} does not exist")
        return row

    @staticmethod
    def _schema(conn: Connection, table_id: int, schema_id: int) -> Schema:
        fields = conn.execute(
            select(schemas.c.fields).where(
                schemas.c.table_id == table_id, schemas.c.schema_id == schema_id
            )
        ).scalar_one()
        return Schema.from_json({"schema_id": schema_id, "fields": fields})

    @staticmethod
    def _live_sources(
        conn: Connection, table_id: int, names: Iterable[str] | None = None
    ) -> dict[str, Any]:
        """Current (not removed) sources with their latest state_version, by name."""
        st = source_states.alias("st")
        latest = (
            select(func.max(st.c.version)).where(st.c.source_id == sources.c.id).scalar_subquery()
        )
        q = (
            select(sources.c.id, sources.c.name, source_states.c.state_version)
            .join(source_states, source_states.c.source_id == sources.c.id)
            .where(
                sources.c.table_id == table_id,
                sources.c.removed_version.is_(None),
                source_states.c.version == latest,
            )
        )
        if names is not None:
            q = q.where(sources.c.name.in_(sorted(set(names))))
        return {r.name: r for r in conn.execute(q)}

    @staticmethod
    def _resolve_version(
        conn: Connection, t: Row[Any], version: int | None, as_of: float | None
    ) -> int:
        if version is not None and as_of is not None:
            raise InvalidArgument("give either version or as_of, not both")
        if as_of is not None:
            v = conn.execute(
                select(func.max(versions.c.version)).where(
                    # Commit times have microsecond precision; absorb float rounding of as_of.
                    versions.c.table_id == t.id,
                    versions.c.committed_at <= as_of + 5e-7,
                )
            ).scalar()
            if v is None:
                raise NotFound(f"table {t.name!r} has no version committed at or before {as_of}")
            version = int(v)
        if version is None:
            return int(t.current_version)
        if isinstance(version, bool) or not isinstance(version, int):
            raise InvalidArgument(f"version must be an integer, got {version!r}")
        if version > t.current_version or version < 0:
            raise NotFound(
                f"table {t.name!r} has no version {version} (latest is {t.current_version})"
            )
        if version < t.min_version:
            raise NotFound(
                f"version {version} of table {t.name!r} has expired (oldest kept is "
                f"{t.min_version})"
            )
        return version

    # ------------------------------------------------------------------ tables

    def create_table(
        self,
        name: str,
        schema: Sequence[Mapping[str, Any]],
        *,
        partition_by: Sequence[str] = (),
        primary_key: Sequence[str] = (),
        properties: Mapping[str, Any] | None = None,
        commit_id: str | None = None,
    ) -> CommitResult:
        """Create a table at version 0 with schema 0."""
        _check_table_name(name)
        sch = new_schema(_as_list(schema, "schema"))
        partition_by = _as_list(partition_by, "partition_by")
        primary_key = _as_list(primary_key, "primary_key")
        for what, cols in (("partition_by", partition_by), ("primary_key", primary_key)):
            for c in cols:
                if c not in sch.names:
                    raise InvalidArgument(f"{what} column {c!r} is not in the schema of {name!r}")
        props = dict(properties or {})
        _check_json(props, "properties")
        try:
            with write_tx(self.engine) as conn:
                if conn.execute(select(tables.c.id).where(tables.c.name == name)).first():
                    raise AlreadyExists(f"table {name!r} already exists")
                now = db.db_now(conn)
                table_id = _new_id(
                    conn.execute(
                        insert(tables).values(
                            name=name,
                            current_version=0,
                            min_version=0,
                            partition_by=partition_by,
                            primary_key=primary_key,
                            last_field_id=sch.last_field_id,
                            next_fencing_token=1,
                            created_at=now,
                        )
                    )
                )
                conn.execute(
                    insert(schemas).values(
                        table_id=table_id,
                        schema_id=0,
                        fields=[f.to_json() for f in sch.fields],
                        added_version=0,
                    )
                )
                conn.execute(
                    insert(versions).values(
                        table_id=table_id,
                        version=0,
                        committed_at=now,
                        commit_id=commit_id or f"create-{uuid.uuid4().hex}",
                        schema_id=0,
                        summary={"operation": "create_table"},
                    )
                )
                for k, v in props.items():
                    conn.execute(
                        insert(kv).values(
                            table_id=table_id, ns="property", key=k, version=0, value=v
                        )
                    )
        except IntegrityError as e:
            # Two creators raced on Postgres; the loser sees the unique name constraint.
            raise AlreadyExists(f"table {name!r} already exists") from e
        log.info("created table %s", name)
        return CommitResult(0, True, 0)

    def drop_table(self, name: str) -> None:
        with write_tx(self.engine) as conn:
            t = self._table_row(conn, name, for_update=True)
            conn.execute(delete(tables).where(tables.c.id == t.id))
        log.info("dropped table %s", name)

    def list_tables(self) -> list[str]:
        with read_tx(self.engine) as conn:
            return [r[0] for r in conn.execute(select(tables.c.name).order_by(tables.c.name))]

    # ------------------------------------------------------------------ reads

    def describe(
        self, name: str, version: int | None = None, as_of: float | None = None
    ) -> TableSnapshot:
        """The table at ``version`` (or the latest version committed at or before ``as_of``)."""
        with read_tx(self.engine) as conn:
            t = self._table_row(conn, name)
            v = self._resolve_version(conn, t, version, as_of)
            vrow = conn.execute(
                select(versions.c.committed_at, versions.c.schema_id).where(
                    versions.c.table_id == t.id, versions.c.version == v
                )
            ).one()
            schema = self._schema(conn, t.id, vrow.schema_id)

            # Latest state row at or before v, per source alive at v: one index seek each.
            st = source_states.alias("st")
            latest = (
                select(func.max(st.c.version))
                .where(st.c.source_id == sources.c.id, st.c.version <= v)
                .scalar_subquery()
            )
            rows = conn.execute(
                select(
                    sources.c.name,
                    sources.c.kind,
                    sources.c.config,
                    sources.c.partition,
                    sources.c.added_version,
                    source_states.c.state,
                    source_states.c.state_version,
                )
                .join(source_states, source_states.c.source_id == sources.c.id)
                .where(
                    sources.c.table_id == t.id,
                    sources.c.added_version <= v,
                    or_(sources.c.removed_version.is_(None), sources.c.removed_version > v),
                    source_states.c.version == latest,
                )
                .order_by(sources.c.id)
            )
            snaps = tuple(
                SourceSnapshot(
                    r.name,
                    r.kind,
                    r.config,
                    r.partition,
                    r.state,
                    int(r.state_version),
                    int(r.added_version),
                )
                for r in rows
            )

            k2 = kv.alias("k2")
            latest_kv = (
                select(func.max(k2.c.version))
                .where(
                    k2.c.table_id == kv.c.table_id,
                    k2.c.ns == kv.c.ns,
                    k2.c.key == kv.c.key,
                    k2.c.version <= v,
                )
                .scalar_subquery()
            )
            props: dict[str, Any] = {}
            external: dict[str, Any] = {}
            for r in conn.execute(
                select(kv.c.ns, kv.c.key, kv.c.value).where(
                    kv.c.table_id == t.id, kv.c.version == latest_kv
                )
            ):
                if r.value is not None:
                    (props if r.ns == "property" else external)[r.key] = r.value
            return TableSnapshot(
                table=name,
                version=v,
                committed_at=float(vrow.committed_at),
                schema=schema,
                partition_by=tuple(t.partition_by),
                primary_key=tuple(t.primary_key),
                properties=props,
                external_state=external,
                sources=snaps,
            )

    def find_commit(self, name: str, commit_id: str) -> int | None:
        """The version a commit id produced, or None if it was never applied."""
        with read_tx(self.engine) as conn:
            t = self._table_row(conn, name)
            v = conn.execute(
                select(versions.c.version).where(
                    versions.c.table_id == t.id, versions.c.commit_id == commit_id
                )
            ).scalar()
            return None if v is None else int(v)

    def current_version(self, name: str) -> int:
        with read_tx(self.engine) as conn:
            return int(self._table_row(conn, name).current_version)

    def history(self, name: str, limit: int | None = None) -> list[CommitInfo]:
        """Commits of the table, newest first."""
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise InvalidArgument(f"limit must be a positive integer, got {limit!r}")
        with read_tx(self.engine) as conn:
            t = self._table_row(conn, name)
            q = (
                select(versions)
                .where(versions.c.table_id == t.id)
                .order_by(versions.c.version.desc())
                .limit(limit)
            )
            return [
                CommitInfo(
                    int(r.version), float(r.committed_at), r.commit_id, int(r.schema_id), r.summary
                )
                for r in conn.execute(q)
            ]

    # ------------------------------------------------------------------ commit

    def commit(
        self,
        table: str,
        commit_id: str,
        *,
        lock_id: str | None = None,
        fencing_token: int | None = None,
        add_sources: Sequence[SourceSpec | Mapping[str, Any]] = (),
        remove_sources: Sequence[str] = (),
        updates: Sequence[SourceUpdate | Mapping[str, Any]] = (),
        external_state: Mapping[str, Any] | None = None,
        properties: Mapping[str, Any] | None = None,
        schema_changes: Sequence[Mapping[str, Any]] | None = None,
        summary: Mapping[str, Any] | None = None,
    ) -> CommitResult:
        """Apply every change as version N+1 in one transaction, or nothing.

        Repeating a ``commit_id`` returns the version it produced and applies nothing.
        """
        if not isinstance(commit_id, str) or not commit_id or len(commit_id) > 256:
            raise InvalidArgument("commit_id must be a non-empty string of at most 256 chars")
        adds = [
            a if isinstance(a, SourceSpec) else SourceSpec.from_json(a)
            for a in _as_list(add_sources, "add_sources")
        ]
        ups = [
            u if isinstance(u, SourceUpdate) else SourceUpdate.from_json(u)
            for u in _as_list(updates, "updates")
        ]
        removes = [str(r) for r in _as_list(remove_sources, "remove_sources")]
        ext = dict(external_state or {})
        props = dict(properties or {})
        changes = _as_list(schema_changes, "schema_changes")
        for a in adds:
            if not _SOURCE_NAME.match(a.name) or len(a.name) > 512:
                raise InvalidArgument(f"invalid source name {a.name!r}")
            _check_json(
                {"config": a.config, "partition": a.partition, "state": a.state},
                f"source {a.name!r}",
            )
        for u in ups:
            _check_json(u.state, f"state of source {u.source!r}")
        _check_json(ext, "external_state")
        _check_json(props, "properties")
        _check_json(dict(summary or {}), "summary")
        if not (adds or ups or removes or ext or props or changes):
            raise InvalidArgument(f"commit {commit_id!r} on table {table!r} changes nothing")
        names = [a.name for a in adds] + [u.source for u in ups] + removes
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InvalidArgument(f"commit touches source(s) {dupes} more than once")

        with write_tx(self.engine) as conn:
            t = self._table_row(conn, table, for_update=True)
            done = conn.execute(
                select(versions.c.version, versions.c.schema_id).where(
                    versions.c.table_id == t.id, versions.c.commit_id == commit_id
                )
            ).first()
            if done is not None:
                log.info(
                    "commit %s on %s already applied as version %s", commit_id, table, done.version
                )
                return CommitResult(int(done.version), False, int(done.schema_id))

            now = db.db_now(conn)
            prev = conn.execute(
                select(versions.c.committed_at, versions.c.schema_id).where(
                    versions.c.table_id == t.id, versions.c.version == t.current_version
                )
            ).one()
            # Commit times never go backwards, so as_of lookups are unambiguous.
            now = max(now, float(prev.committed_at))
            touched = [u.source for u in ups] + removes
            live = self._live_sources(conn, t.id, touched + [a.name for a in adds])
            self._check_locks(conn, t, touched, lock_id, fencing_token, now)

            for n in touched:
                if n not in live:
                    raise NotFound(f"source {n!r} does not exist in table {table!r}")
            for u in ups:
                cur = int(live[u.source].state_version)
                if u.expect_state_version is not None and u.expect_state_version != cur:
                    raise Conflict(
                        f"source {u.source!r} of table {table!r} is at state version {cur}, "
                        f"expected {u.expect_state_version}"
                    )
            partition_cols = set(t.partition_by)
            for a in adds:
                if a.name in live:
                    raise AlreadyExists(f"source {a.name!r} already exists in table {table!r}")
                bad = set(a.partition) - partition_cols
                if bad:
                    raise InvalidArgument(
                        f"source {a.name!r}: partition keys {sorted(bad)} are not partition_by "
                        f"columns of table {table!r} ({sorted(partition_cols)})"
                    )

            schema_id = int(prev.schema_id)
            new_version = int(t.current_version) + 1
            table_updates: dict[str, Any] = {"current_version": new_version}
            if changes:
                current = self._schema(conn, t.id, schema_id)
                nxt = evolve(
                    current,
                    changes,
                    protected=list(t.partition_by) + list(t.primary_key),
                    last_field_id=int(t.last_field_id),
                )
                schema_id = nxt.schema_id
                conn.execute(
                    insert(schemas).values(
                        table_id=t.id,
                        schema_id=schema_id,
                        fields=[f.to_json() for f in nxt.fields],
                        added_version=new_version,
                    )
                )
                table_updates["last_field_id"] = max(int(t.last_field_id), nxt.last_field_id)

            info = dict(summary or {})
            info.update(
                {
                    "updated": [u.source for u in ups],
                    "added": [a.name for a in adds],
                    "removed": removes,
                    "external_state": sorted(ext),
                    "properties": sorted(props),
                    "schema_changes": len(changes),
                }
            )
            info.setdefault("operation", "commit")
            if lock_id:
                info["lock_id"] = lock_id
            conn.execute(
                insert(versions).values(
                    table_id=t.id,
                    version=new_version,
                    committed_at=now,
                    commit_id=commit_id,
                    schema_id=schema_id,
                    summary=info,
                )
            )
            for a in adds:
                sid = _new_id(
                    conn.execute(
                        insert(sources).values(
                            table_id=t.id,
                            name=a.name,
                            kind=a.kind,
                            config=dict(a.config),
                            partition=dict(a.partition),
                            added_version=new_version,
                        )
                    )
                )
                conn.execute(
                    insert(source_states).values(
                        source_id=sid, version=new_version, state=dict(a.state), state_version=1
                    )
                )
            for u in ups:
                row = live[u.source]
                conn.execute(
                    insert(source_states).values(
                        source_id=row.id,
                        version=new_version,
                        state=dict(u.state),
                        state_version=int(row.state_version) + 1,
                    )
                )
            for n in removes:
                conn.execute(
                    update(sources)
                    .where(sources.c.id == live[n].id)
                    .values(removed_version=new_version)
                )
            for ns, values in (("external", ext), ("property", props)):
                for k, val in values.items():
                    conn.execute(
                        insert(kv).values(
                            table_id=t.id, ns=ns, key=str(k), version=new_version, value=val
                        )
                    )
            conn.execute(update(tables).where(tables.c.id == t.id).values(**table_updates))
        log.debug("table %s: commit %s -> version %d", table, commit_id, new_version)
        return CommitResult(new_version, True, schema_id)

    def evolve_schema(
        self, table: str, commit_id: str, changes: Sequence[Mapping[str, Any]]
    ) -> CommitResult:
        """Commit only a schema change (see ``schema.evolve`` for the operations)."""
        if not changes:
            raise InvalidArgument("evolve_schema needs at least one change")
        return self.commit(
            table, commit_id, schema_changes=changes, summary={"operation": "evolve_schema"}
        )

    def _check_locks(
        self,
        conn: Connection,
        t: Row[Any],
        touched: Sequence[str],
        lock_id: str | None,
        fencing_token: int | None,
        now: float,
    ) -> None:
        held = conn.execute(
            select(locks).where(
                locks.c.table_id == t.id, locks.c.granted.is_(True), locks.c.expires_at > now
            )
        ).all()
        if lock_id is not None:
            mine = next((r for r in held if r.lock_id == lock_id), None)
            if mine is None:
                raise LockExpired(
                    f"lock {lock_id!r} on table {t.name!r} has expired, was released or does not "
                    "exist; nothing was committed"
                )
            if fencing_token is not None and fencing_token != mine.fencing_token:
                raise LockExpired(
                    f"fencing token {fencing_token} is stale for lock {lock_id!r} on table "
                    f"{t.name!r} (current {mine.fencing_token})"
                )
        touched_set = set(touched)
        for r in held:
            if r.lock_id == lock_id:
                continue
            overlap = touched_set & set(r.sources)
            if overlap:
                raise Conflict(
                    f"source(s) {sorted(overlap)} of table {t.name!r} are locked by "
                    f"{r.owner!r} (lock {r.lock_id}); commit with that lock or wait for it"
                )

    # ------------------------------------------------------------------ locks

    def lock(
        self,
        table: str,
        source_names: Sequence[str],
        owner: str,
        ttl_s: float,
        wait_s: float = 0.0,
    ) -> LockGrant:
        """Lease a lock on ``source_names`` (all or nothing), waiting up to ``wait_s`` in a queue.

        Requests for overlapping sources are granted in arrival order; a request never overtakes
        an earlier waiting one that overlaps it.
        """
        wanted = sorted(set(_as_list(source_names, "sources")))
        if not wanted or not all(isinstance(s, str) and s for s in wanted):
            raise InvalidArgument("lock needs a non-empty list of source names")
        if not isinstance(ttl_s, (int, float)) or isinstance(ttl_s, bool) or not 0 < ttl_s <= 86400:
            raise InvalidArgument(f"ttl_s must be in (0, 86400], got {ttl_s!r}")
        if not isinstance(wait_s, (int, float)) or isinstance(wait_s, bool) or wait_s < 0:
            raise InvalidArgument(f"wait_s must be >= 0, got {wait_s!r}")
        if not isinstance(owner, str) or not owner:
            raise InvalidArgument("lock owner must be a non-empty string")
        lock_id = uuid.uuid4().hex
        deadline = time.monotonic() + float(wait_s)
        my_seq: int | None = None
        poll = self._lock_poll_s
        granted = False
        try:
            while True:
                with write_tx(self.engine) as conn:
                    t = self._table_row(conn, table, for_update=True)
                    now = db.db_now(conn)
                    conn.execute(
                        delete(locks).where(locks.c.table_id == t.id, locks.c.expires_at <= now)
                    )
                    missing = set(wanted) - set(self._live_sources(conn, t.id, wanted))
                    if missing:
                        raise NotFound(
                            f"cannot lock source(s) {sorted(missing)}: not in table {table!r}"
                        )
                    rows = conn.execute(
                        select(locks).where(locks.c.table_id == t.id).order_by(locks.c.seq)
                    ).all()
                    blockers = [
                        r
                        for r in rows
                        if r.lock_id != lock_id
                        and set(r.sources) & set(wanted)
                        and (r.granted or my_seq is None or r.seq < my_seq)
                    ]
                    if not blockers:
                        token = int(t.next_fencing_token)
                        conn.execute(
                            update(tables)
                            .where(tables.c.id == t.id)
                            .values(next_fencing_token=token + 1)
                        )
                        values = {
                            "granted": True,
                            "fencing_token": token,
                            "expires_at": now + float(ttl_s),
                            "ttl_s": float(ttl_s),
                        }
                        if my_seq is None:
                            conn.execute(
                                insert(locks).values(
                                    lock_id=lock_id,
                                    table_id=t.id,
                                    owner=owner,
                                    sources=wanted,
                                    **values,
                                )
                            )
                        else:
                            n = conn.execute(
                                update(locks).where(locks.c.lock_id == lock_id).values(**values)
                            ).rowcount
                            if n != 1:
                                # Our queue entry expired while we stalled, but nothing blocks
                                # us now: grant with a fresh row.
                                conn.execute(
                                    insert(locks).values(
                                        lock_id=lock_id,
                                        table_id=t.id,
                                        owner=owner,
                                        sources=wanted,
                                        **values,
                                    )
                                )
                        granted = True
                        log.debug("lock %s on %s %s granted to %s", lock_id, table, wanted, owner)
                        return LockGrant(
                            lock_id, table, tuple(wanted), owner, token, now + float(ttl_s)
                        )
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        holders = sorted(
                            {f"{r.owner} ({'holds' if r.granted else 'waits'})" for r in blockers}
                        )
                        raise LockUnavailable(
                            f"source(s) {wanted} of table {table!r} are locked or queued by "
                            f"{', '.join(holders)}"
                        )
                    beat = now + _WAITER_HEARTBEAT_S
                    if my_seq is None:
                        my_seq = _new_id(
                            conn.execute(
                                insert(locks).values(
                                    lock_id=lock_id,
                                    table_id=t.id,
                                    owner=owner,
                                    sources=wanted,
                                    granted=False,
                                    expires_at=beat,
                                    ttl_s=float(ttl_s),
                                )
                            )
                        )
                    else:
                        n = conn.execute(
                            update(locks).where(locks.c.lock_id == lock_id).values(expires_at=beat)
                        ).rowcount
                        if n != 1:
                            my_seq = None
                time.sleep(min(poll, max(remaining, 0.001)))
                poll = min(poll * 1.5, 0.1)
        finally:
            if not granted and my_seq is not None:
                try:
                    with write_tx(self.engine) as conn:
                        conn.execute(delete(locks).where(locks.c.lock_id == lock_id))
                except Exception:  # best effort: the heartbeat expiry frees it anyway
                    log.warning("could not remove queue entry of lock %s", lock_id, exc_info=True)

    def renew_lock(self, lock_id: str, ttl_s: float | None = None) -> float:
        """Extend a granted, unexpired lease; returns the new expiry (epoch seconds)."""
        if ttl_s is not None and (
            isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not 0 < ttl_s <= 86400
        ):
            raise InvalidArgument(f"ttl_s must be in (0, 86400], got {ttl_s!r}")
        with write_tx(self.engine) as conn:
            row = conn.execute(select(locks).where(locks.c.lock_id == lock_id)).first()
            if row is not None:
                t = conn.execute(
                    select(tables.c.name).where(tables.c.id == row.table_id)
                ).scalar_one()
                self._table_row(conn, t, for_update=True)
                row = conn.execute(select(locks).where(locks.c.lock_id == lock_id)).first()
            now = db.db_now(conn)
            if row is None or not row.granted or row.expires_at <= now:
                raise LockExpired(f"lock {lock_id!r} has expired or was released; cannot renew")
            ttl = float(ttl_s if ttl_s is not None else row.ttl_s)
            conn.execute(
                update(locks)
                .where(locks.c.lock_id == lock_id)
                .values(expires_at=now + ttl, ttl_s=ttl)
            )
            return now + ttl

    def unlock(self, lock_id: str) -> None:
        """Release a lock. Releasing an unknown or expired lock is a no-op."""
        with write_tx(self.engine) as conn:
            conn.execute(delete(locks).where(locks.c.lock_id == lock_id))

    # ------------------------------------------------------------------ retention

    def expire_versions(
        self, table: str, *, keep_last: int | None = None, before: float | None = None
    ) -> int:
        """Forget versions older than the last ``keep_last`` and/or committed before ``before``.

        The current version is always kept, and every version kept still resolves exactly as
        before: for each source the state row in force at the new oldest version survives.
        Returns the number of versions expired.
        """
        if keep_last is None and before is None:
            raise InvalidArgument("expire_versions needs keep_last or before")
        if keep_last is not None and (
            isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
        ):
            raise InvalidArgument(f"keep_last must be a positive integer, got {keep_last!r}")
        with write_tx(self.engine) as conn:
            t = self._table_row(conn, table, for_update=True)
            current = int(t.current_version)
            new_min = int(t.min_version)
            if keep_last is not None:
                new_min = max(new_min, current - keep_last + 1)
            if before is not None:
                first_kept = conn.execute(
                    select(func.min(versions.c.version)).where(
                        versions.c.table_id == t.id, versions.c.committed_at >= before
                    )
                ).scalar()
                new_min = max(new_min, current if first_kept is None else int(first_kept))
            new_min = min(new_min, current)
            if new_min <= t.min_version:
                return 0
            table_sources = select(sources.c.id).where(sources.c.table_id == t.id)
            # Drop sources removed at or before the new oldest version (states cascade).
            conn.execute(
                delete(source_states).where(
                    source_states.c.source_id.in_(
                        table_sources.where(sources.c.removed_version <= new_min)
                    )
                )
            )
            conn.execute(
                delete(sources).where(
                    sources.c.table_id == t.id, sources.c.removed_version <= new_min
                )
            )
            st = source_states.alias("st")
            in_force = (
                select(func.max(st.c.version))
                .where(st.c.source_id == source_states.c.source_id, st.c.version <= new_min)
                .scalar_subquery()
            )
            conn.execute(
                delete(source_states).where(
                    source_states.c.source_id.in_(table_sources), source_states.c.version < in_force
                )
            )
            k2 = kv.alias("k2")
            kv_in_force = (
                select(func.max(k2.c.version))
                .where(
                    k2.c.table_id == kv.c.table_id,
                    k2.c.ns == kv.c.ns,
                    k2.c.key == kv.c.key,
                    k2.c.version <= new_min,
                )
                .scalar_subquery()
            )
            conn.execute(delete(kv).where(kv.c.table_id == t.id, kv.c.version < kv_in_force))
            oldest_schema = conn.execute(
                select(versions.c.schema_id).where(
                    versions.c.table_id == t.id, versions.c.version == new_min
                )
            ).scalar_one()
            conn.execute(
                delete(schemas).where(
                    schemas.c.table_id == t.id, schemas.c.schema_id < oldest_schema
                )
            )
            n = conn.execute(
                delete(versions).where(versions.c.table_id == t.id, versions.c.version < new_min)
            ).rowcount
            conn.execute(update(tables).where(tables.c.id == t.id).values(min_version=new_min))
        log.info("table %s: expired %d versions, oldest kept is %d", table, n, new_min)
        return int(n)
