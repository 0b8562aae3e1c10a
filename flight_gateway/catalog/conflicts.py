"""The errors a commit's own checks raise, worded once for both appliers.

The Postgres commit function reports a failed check as ``{"error": code, ...details}``; the
portable applier raises the same errors directly through ``check_failed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flight_gateway.protocol.errors import (
    AlreadyExists,
    Conflict,
    HarnessError,
    InvalidArgument,
    LockExpired,
    NotFound,
)


def check_failed(code: str, table: str, d: Mapping[str, Any]) -> HarnessError:
    if code == "no_table":
        return NotFound(f"table {table!r} does not exist")
    if code == "lock_gone":
        return LockExpired(
            f"lock {d['lock_id']!r} on table {table!r} has expired, was released or does not "
            "exist; nothing was committed"
        )
    if code == "lock_stale":
        return LockExpired(
            f"fencing token {d['token']} is stale for lock {d['lock_id']!r} on table "
            f"{table!r} (current {d['current']})"
        )
    if code == "locked":
        # Never the holder's lock id: that would let this caller commit under the lock.
        return Conflict(
            f"source(s) {sorted(d['sources'])} of table {table!r} are locked by "
            f"{d['owner']!r}; commit with that lock or wait for it"
        )
    if code == "no_source":
        return NotFound(f"source {d['source']!r} does not exist in table {table!r}")
    if code == "cas":
        return Conflict(
            f"source {d['source']!r} of table {table!r} is at state version {d['current']}, "
            f"expected {d['expected']}"
        )
    if code == "source_exists":
        return AlreadyExists(f"source {d['source']!r} already exists in table {table!r}")
    if code == "bad_partition":
        return InvalidArgument(
            f"source {d['source']!r}: partition keys {sorted(d['keys'])} are not partition_by "
            f"columns of table {table!r} ({sorted(d['partition_by'])})"
        )
    return HarnessError(f"commit on table {table!r} failed a check: {code} {dict(d)}")
