"""The lock checks of a commit: its own lock must be live (and its fencing token current), and
no other writer's live lock may cover a source it changes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from flight_gateway.catalog.conflicts import check_failed


def check_locks(
    held: Iterable[Any],
    table: str,
    touched: Sequence[str],
    lock_id: str | None,
    fencing_token: int | None,
) -> None:
    """``held``: the table's granted, unexpired lock rows (lock_id, owner, sources, token)."""
    held = list(held)
    if lock_id is not None:
        mine = next((r for r in held if r.lock_id == lock_id), None)
        if mine is None:
            raise check_failed("lock_gone", table, {"lock_id": lock_id})
        if fencing_token is not None and fencing_token != mine.fencing_token:
            raise check_failed(
                "lock_stale",
                table,
                {"lock_id": lock_id, "token": fencing_token, "current": mine.fencing_token},
            )
    touched_set = set(touched)
    for r in held:
        if r.lock_id == lock_id:
            continue
        overlap = touched_set & set(r.sources)
        if overlap:
            raise check_failed("locked", table, {"sources": overlap, "owner": r.owner})
