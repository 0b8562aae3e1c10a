"""Retention: forgetting old versions while every kept version still reads exactly as before."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import Connection, Engine, Row, delete, func, select, update

from flight_gateway.catalog.db import (
    kv,
    schemas,
    source_states,
    sources,
    tables,
    versions,
    write_tx,
)
from flight_gateway.catalog.in_force import kv_in_force, state_in_force
from flight_gateway.catalog.queries import table_row
from flight_gateway.catalog.validation import check_positive_int
from flight_gateway.protocol.errors import InvalidArgument

log = logging.getLogger(__name__)


def _new_oldest(conn: Connection, t: Row[Any], keep_last: int | None, before: float | None) -> int:
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
    return min(new_min, current)


def _forget_before(conn: Connection, table_id: int, new_min: int) -> int:
    """Delete what no version at or after ``new_min`` reads; returns the versions deleted."""
    table_sources = select(sources.c.id).where(sources.c.table_id == table_id)
    gone = table_sources.where(sources.c.removed_version <= new_min)
    # Sources removed at or before the new oldest version are read by no kept version.
    conn.execute(delete(source_states).where(source_states.c.source_id.in_(gone)))
    conn.execute(
        delete(sources).where(sources.c.table_id == table_id, sources.c.removed_version <= new_min)
    )
    # Rows older than the one in force at new_min are read by no kept version.
    conn.execute(
        delete(source_states).where(
            source_states.c.source_id.in_(table_sources),
            source_states.c.version < state_in_force(new_min),
        )
    )
    conn.execute(delete(kv).where(kv.c.table_id == table_id, kv.c.version < kv_in_force(new_min)))
    oldest_schema = conn.execute(
        select(versions.c.schema_id).where(
            versions.c.table_id == table_id, versions.c.version == new_min
        )
    ).scalar_one()
    conn.execute(
        delete(schemas).where(schemas.c.table_id == table_id, schemas.c.schema_id < oldest_schema)
    )
    return int(
        conn.execute(
            delete(versions).where(versions.c.table_id == table_id, versions.c.version < new_min)
        ).rowcount
    )


def expire_versions(
    engine: Engine, table: str, *, keep_last: int | None = None, before: float | None = None
) -> int:
    if keep_last is None and before is None:
        raise InvalidArgument("expire_versions needs keep_last or before")
    if keep_last is not None:
        check_positive_int(keep_last, "keep_last")
    with write_tx(engine) as conn:
        t = table_row(conn, table, for_update=True)
        new_min = _new_oldest(conn, t, keep_last, before)
        if new_min <= t.min_version:
            return 0
        n = _forget_before(conn, t.id, new_min)
        conn.execute(update(tables).where(tables.c.id == t.id).values(min_version=new_min))
    log.info("table %s: expired %d versions, oldest kept is %d", table, n, new_min)
    return n
