"""A table version described in one statement, off SQLAlchemy's execution layers.

Every read pins a version and every DoPut reads the latest one twice (before its lease and
under it); under a write load nearly each of them is a version not described before. The
SQLAlchemy path (``queries.describe``) takes six statements in a transaction, ~3.5 ms of CPU
idle on a Postgres catalog and ten waits on the server, each a hand-over of the interpreter
lock; under 64 readers and 16 writers on 2 cores describing was a third of a DoPut's samples
and a fifth of its lease (py-spy, ``bench_chaos`` load). Here the version's row, its sources
with their states in force and its key/values come back as one ``UNION ALL`` (JSON columns as
text, parsed here) built from the same ``in_force`` rule, compiled once per dialect, run on
the pool's DBAPI connection: one statement is one consistent read on both databases, so no
transaction is needed, and a table dropped meanwhile shows as no row, never as a version
without sources.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from sqlalchemy import (
    BigInteger,
    Engine,
    Float,
    Integer,
    Text,
    and_,
    bindparam,
    cast,
    literal_column,
    null,
    select,
    union_all,
)

from flight_gateway.catalog.db import one_statement, schemas, tables, versions
from flight_gateway.catalog.in_force import kv_at, sources_at
from flight_gateway.catalog.model import SourceSnapshot, TableSnapshot
from flight_gateway.catalog.schema import Schema
from flight_gateway.protocol.errors import NotFound

#: Parts of the statement's rows (its first column).
_HEAD, _SOURCE, _KV = 0, 1, 2


def _nothing(type_: Any) -> Any:
    return cast(null(), type_)


def _statement() -> Any:
    table_id = bindparam("table_id", type_=Integer)
    version = bindparam("version", type_=BigInteger)
    # The table's row whatever the version: no row means dropped; the version's own row
    # missing (or below min_version) means it expired or never was.
    head = (
        select(
            literal_column(str(_HEAD)).label("part"),
            tables.c.min_version.label("i1"),
            versions.c.schema_id.label("i2"),
            tables.c.current_version.label("i3"),
            versions.c.committed_at.label("f"),
            cast(schemas.c.fields, Text).label("t1"),
            cast(tables.c.partition_by, Text).label("t2"),
            cast(tables.c.primary_key, Text).label("t3"),
            _nothing(Text).label("t4"),
            _nothing(Text).label("t5"),
        )
        .select_from(
            tables.outerjoin(
                versions, and_(versions.c.table_id == tables.c.id, versions.c.version == version)
            ).outerjoin(
                schemas,
                and_(
                    schemas.c.table_id == tables.c.id, schemas.c.schema_id == versions.c.schema_id
                ),
            )
        )
        .where(tables.c.id == table_id)
    )
    s = sources_at(table_id, version).order_by(None).subquery("s")
    source_rows = select(
        literal_column(str(_SOURCE)),
        s.c.state_version,
        s.c.added_version,
        s.c.id,
        _nothing(Float),
        cast(s.c.name, Text),
        cast(s.c.kind, Text),
        cast(s.c.config, Text),
        cast(s.c.partition, Text),
        cast(s.c.state, Text),
    )
    k = kv_at(table_id, version).subquery("k")
    kv_rows = select(
        literal_column(str(_KV)),
        _nothing(BigInteger),
        _nothing(BigInteger),
        _nothing(BigInteger),
        _nothing(Float),
        cast(k.c.ns, Text),
        cast(k.c.key, Text),
        cast(k.c.value, Text),
        _nothing(Text),
        _nothing(Text),
    )
    return union_all(head, source_rows, kv_rows)


#: (SQL, parameter names in order or None for named parameters) per dialect and driver.
_COMPILED: dict[str, tuple[str, tuple[str, ...] | None]] = {}
#: Parsed schemas by their text (and id): shared by every catalog of the process, so keyed by
#: content, never by ids another database reuses.
_SCHEMAS: dict[tuple[int, str], Schema] = {}
_SCHEMAS_KEPT = 1024
_lock = threading.Lock()


def _compiled(engine: Engine) -> tuple[str, tuple[str, ...] | None]:
    dialect = engine.dialect
    key = f"{dialect.name}+{dialect.driver}:{dialect.paramstyle}"
    hit = _COMPILED.get(key)
    if hit is None:
        compiled = _statement().compile(dialect=dialect)
        order = (
            tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None
        )
        hit = _COMPILED[key] = (str(compiled), order)
    return hit


def _params(order: tuple[str, ...] | None, values: dict[str, Any]) -> Any:
    return values if order is None else tuple(values[n] for n in order)


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _schema(schema_id: int, fields: str) -> Schema:
    key = (schema_id, fields)
    hit = _SCHEMAS.get(key)
    if hit is None:
        hit = Schema.from_json({"schema_id": schema_id, "fields": json.loads(fields)})
        with _lock:
            if len(_SCHEMAS) >= _SCHEMAS_KEPT:
                _SCHEMAS.clear()
            _SCHEMAS[key] = hit
    return hit


def describe_at(engine: Engine, name: str, table_id: int, version: int) -> TableSnapshot:
    """Version ``version`` of incarnation ``table_id`` of ``name``, as ``queries.describe``
    reads it (NOT_FOUND when the table was dropped, the version expired or never was)."""
    sql, order = _compiled(engine)
    rows = one_statement(engine, sql, _params(order, {"table_id": table_id, "version": version}))
    head = next((r for r in rows if r[0] == _HEAD), None)
    if head is None:
        raise NotFound(f"table {name!r} was dropped while it was being read")
    min_version, schema_id, current = head[1], head[2], head[3]
    if version > current or version < 0:
        raise NotFound(f"table {name!r} has no version {version} (latest is {current})")
    if version < min_version or schema_id is None:
        raise NotFound(
            f"version {version} of table {name!r} has expired (oldest kept is {min_version})"
        )
    found = sorted((r for r in rows if r[0] == _SOURCE), key=lambda r: int(r[3]))
    props: dict[str, Any] = {}
    external: dict[str, Any] = {}
    for r in rows:
        if r[0] == _KV and (value := _json(r[7])) is not None:  # null: the key was deleted
            (props if r[5] == "property" else external)[r[6]] = value
    return TableSnapshot(
        table=name,
        version=version,
        committed_at=float(head[4]),
        schema=_schema(int(schema_id), head[5]),
        partition_by=tuple(_json(head[6])),
        primary_key=tuple(_json(head[7])),
        properties=props,
        external_state=external,
        sources=tuple(
            SourceSnapshot(r[5], r[6], _json(r[7]), _json(r[8]), _json(r[9]), int(r[1]), int(r[2]))
            for r in found
        ),
        table_id=table_id,
    )
