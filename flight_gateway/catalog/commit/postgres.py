"""Apply a group of commits on Postgres with one call of the commit function (one round trip).

The call runs on a connection in autocommit mode (``db.autocommit_engine``): the single
statement is its own transaction, and a failure inside the function rolls back everything it
did. A dead pooled connection is retried once, safe because a commit id applies at most once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine

from flight_gateway.catalog.commit.request import CommitRequest
from flight_gateway.catalog.conflicts import check_failed
from flight_gateway.catalog.db import call_once_retried
from flight_gateway.catalog.model import CommitResult
from flight_gateway.protocol.errors import HarnessError

Outcome = CommitResult | HarnessError

_CALL = "SELECT harness_commit_group(%s, %s::jsonb)"


def _outcome(table: str, o: dict[str, Any]) -> Outcome:
    if "error" in o:
        return check_failed(str(o["error"]), table, o)
    return CommitResult(int(o["version"]), bool(o["applied"]), int(o["schema_id"]))


def apply_group(engine: Engine, table: str, batch: Sequence[CommitRequest]) -> list[Outcome]:
    """Apply ``batch`` (no schema changes) in order, each as its own version."""
    payload = "[" + ",".join(r.to_json() for r in batch) + "]"
    result = call_once_retried(engine, _CALL, (table, payload))
    if isinstance(result, str):
        result = json.loads(result)
    if isinstance(result, dict):  # the table itself is missing
        raise check_failed(str(result["error"]), table, result)
    return [_outcome(table, o) for o in result]
