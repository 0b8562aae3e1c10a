"""The harness catalog: tables, sources, versioned source states, commits, locks, retention.

``Catalog`` is a facade over modules split by concern:

- ``queries``: describe a version, history, find a commit, list tables;
- ``admin``: create and drop tables;
- ``commit``: validated commit requests, applied to the table in groups;
- ``locks``: lease locks with a fair queue and fencing tokens;
- ``retention``: expiring old versions;
- ``in_force``: the one rule for what a version reads (a source's latest state at or before it).

Every mutation is one database transaction that first takes the table's row lock (see ``db``),
so versions are gap-free and commits on disjoint sources queue instead of failing. Conflicts
are decided per source: compare-and-set on a source's ``state_version`` and source locks.
No external I/O happens inside a catalog transaction.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from flight_gateway.catalog import admin, db, queries, retention, snapshot_read
from flight_gateway.catalog.commit import Committer, GroupStats, build_request
from flight_gateway.catalog.locks import Locks
from flight_gateway.catalog.model import (
    CommitInfo,
    CommitResult,
    LockGrant,
    LockInfo,
    SourceDef,
    SourceSpec,
    SourceUpdate,
    TableHead,
    TableSnapshot,
)
from flight_gateway.protocol.errors import HarnessError, InvalidArgument

#: Default cap on how long ``lock(wait_s=...)`` may wait in the queue.
DEFAULT_MAX_WAIT_S = 300.0


class Catalog:
    """Harness catalog on a SQLAlchemy URL (``sqlite:///path`` or ``postgresql://...``)."""

    def __init__(
        self,
        url: str,
        *,
        lock_poll_s: float = 0.01,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
        group_commit: bool = True,
        max_group: int = 256,
    ) -> None:
        """``group_commit``: concurrent commits to one table from this process's threads are
        applied together in one catalog transaction (each its own version with its own
        checks and result), at most ``max_group`` at a time."""
        self.url = db.normalize_url(url)
        self.engine = db.make_engine(self.url)
        db.migrate(self.engine)
        with db.read_tx(self.engine) as conn:
            #: This catalog's identity (``db.catalog_info``), made once when it was created.
            self.catalog_id = db.catalog_id(conn)
        if not re.fullmatch("[0-9a-f]{32}", self.catalog_id):  # set by hand: its tag unread
            raise HarnessError(
                f"catalog id {self.catalog_id!r} is not 32 lowercase hex digits: set "
                "harness_catalog_info.catalog_id to a new one (docs/operations.md, Backup)"
            )
        self._fast = None
        if not db.is_sqlite(self.engine):
            usable = db.usable_connections(self.engine)
            if db.pool_sizes(usable) != db.pool_sizes(None):  # a small server: fit the pools
                self.engine.dispose()
                self.engine = db.make_engine(self.url, usable)
            # One-statement transactions (commits, lock steps): one round trip each.
            self._fast = db.autocommit_engine(self.url, usable)
        self._commits = Committer(
            self.engine, self._fast, group_commit=group_commit, max_group=max_group
        )
        self._locks = Locks(self.engine, self._fast, poll_s=lock_poll_s, max_wait_s=max_wait_s)

    @property
    def catalog_tag(self) -> str:
        """What names this catalog's files apart in storage another catalog may share (a files
        root): the first 12 hex digits of its id."""
        return self.catalog_id[:12]

    def close(self) -> None:
        if self._fast is not None:
            self._fast.dispose()
        self.engine.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        return admin.create_table(
            self.engine,
            name,
            schema,
            partition_by=partition_by,
            primary_key=primary_key,
            properties=properties,
            commit_id=commit_id,
        )

    def drop_table(self, name: str) -> None:
        admin.drop_table(self.engine, name)

    def list_tables(self) -> list[str]:
        return queries.list_tables(self.engine)

    # ------------------------------------------------------------------ reads

    def describe(
        self, name: str, version: int | None = None, as_of: float | None = None
    ) -> TableSnapshot:
        """The table at ``version`` (or the latest version committed at or before ``as_of``)."""
        return queries.describe(self.engine, name, version, as_of)

    def describe_at(self, name: str, table_id: int, version: int) -> TableSnapshot:
        """``describe(name, version)`` of incarnation ``table_id`` (from a head the caller
        read), in one statement (``snapshot_read``)."""
        return snapshot_read.describe_at(self._fast or self.engine, name, table_id, version)

    def source_kinds(self) -> list[str]:
        """The kinds of the sources tables have now (the gateway warms them at start)."""
        return queries.source_kinds(self.engine)

    def live_sources(self, name: str, sources: Sequence[str]) -> dict[str, SourceDef]:
        """Kind, config and partition of the named sources as they are now (cheap: no states)."""
        return queries.live_sources(self._fast or self.engine, name, list(sources))

    def find_commit(self, name: str, commit_id: str) -> int | None:
        """The version a commit id produced, or None if it was never applied."""
        return queries.find_commit(self._fast or self.engine, name, commit_id)

    def find_commits(self, name: str, commit_ids: Sequence[str]) -> dict[str, int]:
        """The commit ids of ``commit_ids`` that were applied, with the versions they produced."""
        return queries.find_commits(self._fast or self.engine, name, commit_ids)

    def head_with_commits(
        self, name: str, commit_ids: Sequence[str]
    ) -> tuple[TableHead, dict[str, int]]:
        """``head(name)`` and ``find_commits(name, commit_ids)`` in one read."""
        return queries.head_with_commits(self._fast or self.engine, name, commit_ids)

    def now(self) -> float:
        """The catalog database's clock (the clock of commit times), epoch seconds: one
        statement on Postgres, none on SQLite (whose commit times are this machine's clock).
        A Flight SQL statement over several tables asks it to pin them all at one moment."""
        if db.is_sqlite(self.engine):
            return time.time()
        rows = db.one_statement(
            self._fast or self.engine, "SELECT EXTRACT(EPOCH FROM clock_timestamp())", ()
        )
        return float(rows[0][0])

    def current_version(self, name: str) -> int:
        return queries.current_version(self.engine, name)

    def head(self, name: str, as_of: float | None = None) -> TableHead:
        """The table's id and the versions it keeps (one primary-key lookup); with ``as_of``
        also the version current then (``version_at``)."""
        return queries.heads(self._fast or self.engine, [name], as_of)[name]

    def heads(self, names: Sequence[str], as_of: float | None = None) -> dict[str, TableHead]:
        """``head`` of each of ``names`` (NOT_FOUND for the first unknown), in one read."""
        return queries.heads(self._fast or self.engine, names, as_of)

    def history(
        self, name: str, limit: int | None = None, until: int | None = None
    ) -> list[CommitInfo]:
        """Commits of the table, newest first (those up to version ``until`` when given)."""
        return queries.history(self.engine, name, limit, until)

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
        request = build_request(
            table,
            commit_id,
            lock_id=lock_id,
            fencing_token=fencing_token,
            add_sources=add_sources,
            remove_sources=remove_sources,
            updates=updates,
            external_state=external_state,
            properties=properties,
            schema_changes=schema_changes,
            summary=summary,
        )
        return self._commits.commit(table, request)

    def commit_all(
        self, table: str, commits: Sequence[Mapping[str, Any]]
    ) -> list[CommitResult | BaseException]:
        """Commits (each ``commit_id`` and the keywords of ``commit``) applied in order in one
        transaction, each as its own version; one outcome each (an exception is returned, not
        raised). A failed transaction fails them all. Each request's own checks (lock, sources)
        run as in ``commit``: callers give requests that pass or fail them together, as one
        writer's commits under one lease do."""
        defaults: dict[str, Any] = {"lock_id": None, "fencing_token": None, "add_sources": (),
                                    "remove_sources": (), "updates": (), "external_state": None,
                                    "properties": None, "schema_changes": None, "summary": None}  # fmt: skip
        requests = []
        for c in commits:
            given = {k: v for k, v in c.items() if k != "commit_id"}
            requests.append(build_request(table, str(c["commit_id"]), **{**defaults, **given}))
        return list(self._commits.commit_all(table, requests))

    def group_commit_stats(self) -> GroupStats | None:
        """How many groups and commits this catalog applied (None without group commit)."""
        return self._commits.stats()

    def evolve_schema(
        self, table: str, commit_id: str, changes: Sequence[Mapping[str, Any]]
    ) -> CommitResult:
        """Commit only a schema change (see ``schema.evolve`` for the operations)."""
        if not changes:
            raise InvalidArgument("evolve_schema needs at least one change")
        return self.commit(
            table, commit_id, schema_changes=changes, summary={"operation": "evolve_schema"}
        )

    # ------------------------------------------------------------------ locks

    def lock(
        self,
        table: str,
        source_names: Sequence[str],
        owner: str,
        ttl_s: float,
        wait_s: float = 0.0,
        lock_id: str | None = None,
    ) -> LockGrant:
        """Lease a lock on ``source_names`` (all or nothing), waiting up to ``wait_s`` in a queue.

        Requests for overlapping sources are granted in arrival order; a request never overtakes
        an earlier waiting one that overlaps it. ``wait_s`` may not exceed the catalog's
        ``max_wait_s``. ``lock_id``: the id to queue and grant under (a new one when None), so a
        caller can say whose it is before it exists (``locks.watch``).
        """
        return self._locks.lock(table, source_names, owner, ttl_s, wait_s, lock_id)

    def renew_lock(self, lock_id: str, ttl_s: float | None = None) -> float:
        """Extend a granted, unexpired lease; returns the new expiry (epoch seconds)."""
        return self._locks.renew(lock_id, ttl_s)

    def unlock(self, lock_id: str) -> None:
        """Release a lock. Releasing an unknown or expired lock is a no-op."""
        self._locks.unlock(lock_id)

    def list_locks(self, table: str) -> list[LockInfo]:
        """The table's granted and queued locks, in queue order."""
        return self._locks.list(table)

    def lock_info(self, lock_id: str) -> LockInfo | None:
        """The stored lock (granted or queued, possibly past its expiry), or None."""
        return self._locks.info(lock_id)

    # ------------------------------------------------------------------ retention

    def expire_versions(
        self, table: str, *, keep_last: int | None = None, before: float | None = None
    ) -> int:
        """Forget versions older than the last ``keep_last`` and/or committed before ``before``.

        The current version is always kept, and every version kept still resolves exactly as
        before: for each source the state row in force at the new oldest version survives.
        Returns the number of versions expired.
        """
        return retention.expire_versions(self.engine, table, keep_last=keep_last, before=before)
