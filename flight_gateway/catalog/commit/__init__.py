"""Commits: validated requests (``request``), grouped per table (``group``) and applied in one
catalog transaction per group: on Postgres by one call of the commit function (``postgres``),
otherwise, and for schema changes, with SQLAlchemy statements (``portable``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from flight_gateway.catalog.commit import postgres
from flight_gateway.catalog.commit.group import GroupCommitter, GroupStats
from flight_gateway.catalog.commit.portable import Outcome, apply_group
from flight_gateway.catalog.commit.request import CommitRequest, build_request
from flight_gateway.catalog.db import write_tx
from flight_gateway.catalog.model import CommitResult
from flight_gateway.protocol.errors import HarnessError

log = logging.getLogger(__name__)

__all__ = ["CommitRequest", "Committer", "GroupStats", "build_request"]


class Committer:
    def __init__(
        self, engine: Engine, fast: Engine | None, *, group_commit: bool, max_group: int
    ) -> None:
        """``fast``: autocommit connections to call the Postgres commit function (None on
        SQLite)."""
        self._engine = engine
        self._fast = fast
        self._groups: GroupCommitter[CommitRequest, Outcome] | None = (
            GroupCommitter(self._apply_group, max_group) if group_commit else None
        )

    def stats(self) -> GroupStats | None:
        return None if self._groups is None else self._groups.stats()

    def _apply(self, table: str, batch: Sequence[CommitRequest]) -> list[Outcome]:
        if self._fast is not None and not any(r.schema_changes for r in batch):
            return postgres.apply_group(self._fast, table, batch)
        with write_tx(self._engine) as conn:
            return apply_group(conn, table, batch)

    def _apply_group(
        self, table: str, batch: Sequence[CommitRequest]
    ) -> list[Outcome | BaseException]:
        try:
            return list(self._apply(table, batch))
        except HarnessError as e:  # about the table (e.g. it was dropped): the same for all
            return [type(e)(str(e)) for _ in batch]
        except Exception as e:
            if len(batch) == 1 or (isinstance(e, DBAPIError) and e.connection_invalidated):
                raise
            # The transaction rolled back whole, so nothing of the group applied. A commit
            # that breaks the transaction (not one of its checks: those fail alone) must not
            # fail its neighbours: give each its own transaction.
            log.warning(
                "a group of %d commits on %s failed (%s); applying them one by one",
                len(batch),
                table,
                e,
            )
            return [self._apply_alone(table, r) for r in batch]

    def _apply_alone(self, table: str, request: CommitRequest) -> Outcome | BaseException:
        try:
            return self._apply_group(table, [request])[0]
        except Exception as e:
            return e

    def commit_all(
        self, table: str, requests: Sequence[CommitRequest]
    ) -> list[Outcome | BaseException]:
        """Apply ``requests`` in order in one transaction, each as its own version. Unlike a
        group of independent commits, a transaction that fails fails every request: the
        requests of one writer build on each other's states, and none may apply without the
        ones before it."""
        try:
            return list(self._apply(table, requests))
        except HarnessError as e:
            return [type(e)(str(e)) for _ in requests]

    def commit(self, table: str, request: CommitRequest) -> CommitResult:
        if self._groups is None:
            outcome = self._apply_group(table, [request])[0]
        else:
            outcome = self._groups.submit(table, request)
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome.applied:
            log.debug(
                "table %s: commit %s -> version %d", table, request.commit_id, outcome.version
            )
        else:
            log.info(
                "commit %s on %s already applied as version %s",
                request.commit_id,
                table,
                outcome.version,
            )
        return outcome
