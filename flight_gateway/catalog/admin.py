"""Creating and dropping tables."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, delete, insert, select
from sqlalchemy.exc import IntegrityError

from flight_gateway.catalog import db
from flight_gateway.catalog.db import kv, schemas, tables, versions, write_tx
from flight_gateway.catalog.model import CommitResult
from flight_gateway.catalog.queries import table_row
from flight_gateway.catalog.schema import Schema, new_schema
from flight_gateway.catalog.validation import as_list, check_json, check_table_name, new_id
from flight_gateway.protocol.errors import AlreadyExists, InvalidArgument

log = logging.getLogger(__name__)


def _created_by(conn: Connection, table_id: int, commit_id: str) -> bool:
    """Whether the table's version 0 (its creation, while kept) has ``commit_id``."""
    row = conn.execute(
        select(versions.c.commit_id).where(
            (versions.c.table_id == table_id) & (versions.c.version == 0)
        )
    ).first()
    return row is not None and row[0] == commit_id


def _insert_table(
    conn: Connection,
    name: str,
    sch: Schema,
    partition_by: list[str],
    primary_key: list[str],
    props: dict[str, Any],
    commit_id: str | None,
) -> None:
    now = db.db_now(conn)
    table_id = new_id(
        conn.execute(
            insert(tables).values(
                id=db.next_table_id(conn),
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
        conn.execute(insert(kv).values(table_id=table_id, ns="property", key=k, version=0, value=v))


def create_table(
    engine: Engine,
    name: str,
    schema: Sequence[Mapping[str, Any]],
    *,
    partition_by: Sequence[str] = (),
    primary_key: Sequence[str] = (),
    properties: Mapping[str, Any] | None = None,
    commit_id: str | None = None,
) -> CommitResult:
    check_table_name(name)
    sch = new_schema(as_list(schema, "schema"))
    partition_by = as_list(partition_by, "partition_by")
    primary_key = as_list(primary_key, "primary_key")
    for what, cols in (("partition_by", partition_by), ("primary_key", primary_key)):
        for c in cols:
            if c not in sch.names:
                raise InvalidArgument(f"{what} column {c!r} is not in the schema of {name!r}")
    props = dict(properties or {})
    check_json(props, "properties")
    if commit_id is not None and (not commit_id or len(commit_id) > 256):
        raise InvalidArgument("commit_id must be a non-empty string of at most 256 chars")
    definition = (sch, partition_by, primary_key)
    try:
        with write_tx(engine) as conn:
            if _existing(conn, name, commit_id, definition):
                return CommitResult(0, False, 0)  # a retry of the create that made it
            _insert_table(conn, name, sch, partition_by, primary_key, props, commit_id)
    except IntegrityError as e:
        # Two creators raced on Postgres; the loser sees the unique name constraint (and
        # answers as a retry would, when the winner was the same create).
        with write_tx(engine) as conn:
            if _existing(conn, name, commit_id, definition):
                return CommitResult(0, False, 0)
        raise AlreadyExists(f"table {name!r} already exists") from e
    log.info("created table %s", name)
    return CommitResult(0, True, 0)


def _existing(
    conn: Connection,
    name: str,
    commit_id: str | None,
    definition: tuple[Schema, list[str], list[str]],
) -> bool:
    """False when there is no table ``name``; True when there is one made by this very create
    (its version 0 has ``commit_id`` and the same schema, partitioning and key); else
    ALREADY_EXISTS (another create, or the same commit id sent with another definition)."""
    row = conn.execute(
        select(tables.c.id, tables.c.partition_by, tables.c.primary_key).where(
            tables.c.name == name
        )
    ).first()
    if row is None:
        return False
    sch, partition_by, primary_key = definition
    if commit_id and _created_by(conn, row.id, commit_id):
        fields = conn.execute(
            select(schemas.c.fields).where(
                (schemas.c.table_id == row.id) & (schemas.c.schema_id == 0)
            )
        ).scalar()
        same = fields == [f.to_json() for f in sch.fields]
        if same and list(row.partition_by) == partition_by and list(row.primary_key) == primary_key:
            return True
        raise AlreadyExists(
            f"table {name!r} already exists: commit id {commit_id!r} made it with another "
            "schema, partitioning or key"
        )
    raise AlreadyExists(f"table {name!r} already exists")


def drop_table(engine: Engine, name: str) -> None:
    with write_tx(engine) as conn:
        t = table_row(conn, name, for_update=True)
        conn.execute(delete(tables).where(tables.c.id == t.id))
    log.info("dropped table %s", name)
