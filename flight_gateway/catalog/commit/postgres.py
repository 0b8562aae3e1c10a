"""Apply a group of commits on Postgres with one call of the commit function (one round trip).

The call runs on a connection in autocommit mode: the single statement is its own transaction,
so there is no BEGIN or COMMIT to wait for, and a failure inside the function rolls back
everything it did. The pool does not ping connections before use (that would be a second round
trip); a connection that turns out dead is retried once, which is safe because a commit id is
applied at most once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import DBAPIError

from flight_gateway.catalog.commit.errors import check_failed
from flight_gateway.catalog.commit.request import CommitRequest
from flight_gateway.catalog.model import CommitResult
from flight_gateway.errors import HarnessError

Outcome = CommitResult | HarnessError

_CALL = "SELECT harness_commit_group(%s, %s::jsonb)"


def autocommit_engine(url: str) -> Engine:
    """Connections for one-statement transactions (commits, lock steps)."""
    return create_engine(
        url, isolation_level="AUTOCOMMIT", pool_size=8, max_overflow=56, pool_reset_on_return=None
    )


def _outcome(table: str, o: dict[str, Any]) -> Outcome:
    if "error" in o:
        return check_failed(str(o["error"]), table, o)
    return CommitResult(int(o["version"]), bool(o["applied"]), int(o["schema_id"]))


def _call(engine: Engine, table: str, payload: str) -> Any:
    with engine.connect() as conn:
        return conn.exec_driver_sql(_CALL, (table, payload)).scalar_one()


def apply_group(engine: Engine, table: str, batch: Sequence[CommitRequest]) -> list[Outcome]:
    """Apply ``batch`` (no schema changes) in order, each as its own version."""
    payload = "[" + ",".join(r.to_json() for r in batch) + "]"
    try:
        result = _call(engine, table, payload)
    except DBAPIError as e:
        if not e.connection_invalidated:
            raise
        result = _call(engine, table, payload)  # idempotent by commit id
    if isinstance(result, str):
        result = json.loads(result)
    if isinstance(result, dict):  # the table itself is missing
        raise check_failed(str(result["error"]), table, result)
    return [_outcome(table, o) for o in result]
