"""Lock actions. Locks are taken, renewed and released by writers of their table; renewing or
releasing someone else's lock needs admin on the table. A lock's owner is recorded as
``<principal>:<label>``, so conflict messages name who holds a source, never a lock id."""

from __future__ import annotations

import math
from typing import Any

from flight_gateway.core import metrics
from flight_gateway.core.auth import Principal
from flight_gateway.core.context import Gateway
from flight_gateway.protocol.errors import (
    InvalidArgument,
    LockExpired,
    LockUnavailable,
    Unauthorized,
)


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    return seconds(value, key)


def seconds(value: object, key: str) -> float:
    """``value`` as a finite number of seconds; anything else is InvalidArgument."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{key!r} must be a number of seconds, got {value!r}")
    try:
        out = float(value)
    except OverflowError:  # an int past float's range
        out = math.inf
    if not math.isfinite(out):
        raise InvalidArgument(f"{key!r} must be a finite number of seconds, got {value!r}")
    return out


def lock(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = body.get("table")
    if not isinstance(table, str) or not table:
        raise InvalidArgument("action body needs 'table'")
    who.require("write", table)
    wait_s = _number(body, "wait_s", 0.0)
    if wait_s > gw.limits.max_lock_wait_s:
        raise InvalidArgument(
            f"wait_s {wait_s} is above this gateway's limit of {gw.limits.max_lock_wait_s} s"
        )
    label = body.get("owner") or "client"
    if not isinstance(label, str):
        raise InvalidArgument("'owner' must be a string")
    try:
        g = gw.catalog.lock(
            table,
            body.get("sources") or [],
            owner=f"{who.name}:{label}",
            ttl_s=_number(body, "ttl_s", 60.0),
            wait_s=wait_s,
        )
    except LockUnavailable:
        metrics.LOCKS.labels("unavailable").inc()
        raise
    metrics.LOCKS.labels("waited" if wait_s > 0 else "granted").inc()
    return {
        "lock_id": g.lock_id,
        "fencing_token": g.fencing_token,
        "expires_at": g.expires_at,
        "sources": list(g.sources),
    }


def list_locks(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    """Who holds or waits for which sources. A lock id lets its bearer commit under the lock,
    so it is shown only to its owner and to admins of the table."""
    table = body.get("table")
    if not isinstance(table, str) or not table:
        raise InvalidArgument("action body needs 'table'")
    who.require("write", table)
    gw.catalog.head(table)  # NOT_FOUND for a table that does not exist, not an empty list
    admin = who.can("admin", table)
    out = []
    for info in gw.catalog.list_locks(table):
        mine = info.owner.split(":", 1)[0] == who.name
        out.append(
            {
                "lock_id": info.lock_id if (admin or mine) else None,
                "owner": info.owner,
                "sources": list(info.sources),
                "granted": info.granted,
                "fencing_token": info.fencing_token,
                "expires_at": info.expires_at,
            }
        )
    return {"locks": out}


def _own(gw: Gateway, who: Principal, lock_id: Any) -> str | None:
    """The lock's id when ``who`` may renew or release it; None when it no longer exists."""
    if not isinstance(lock_id, str) or not lock_id:
        raise InvalidArgument("action body needs 'lock_id'")
    info = gw.catalog.lock_info(lock_id)
    if info is None:
        return None
    who.require("write", info.table)
    if info.owner.split(":", 1)[0] != who.name and not who.can("admin", info.table):
        raise Unauthorized(f"this lock on table {info.table!r} belongs to another principal")
    return lock_id


def renew_lock(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    lock_id = _own(gw, who, body.get("lock_id"))
    if lock_id is None:
        raise LockExpired("the lock has expired or was released; cannot renew")
    return {"expires_at": gw.catalog.renew_lock(lock_id, body.get("ttl_s"))}


def unlock(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    lock_id = _own(gw, who, body.get("lock_id"))
    if lock_id is not None:
        gw.catalog.unlock(lock_id)
    return {}
