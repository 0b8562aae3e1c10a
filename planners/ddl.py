"""Additive schema changes applied to the sources that have a schema of their own.

``evolve_schema`` applies, before committing the new harness schema, the *additive* part of a
change (new columns, widened types) to Postgres (current and history table), Iceberg
(``update_schema``) and DuckLake (``ALTER TABLE``). Kafka, files and Flight sources are schema
on read. Renames and drops stay in the harness schema only (matched through former names), so
readers pinned to older versions keep finding their columns. Every statement is idempotent, so
a partly failed evolution can simply be retried.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from flight_gateway.errors import InvalidArgument
from planners.base import SourceRef
from planners.predicates import quote_ident


@dataclass(frozen=True)
class Additive:
    op: str  # "add" or "widen"
    names: tuple[str, ...]  # current name first, then former names (the physical one may be old)
    type: pa.DataType


def _sql_type(t: pa.DataType, dialect: str) -> str:
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_int8(t) or pa.types.is_int16(t):
        return "SMALLINT"
    if pa.types.is_int32(t):
        return "INTEGER"
    if pa.types.is_int64(t):
        return "BIGINT"
    if pa.types.is_float32(t):
        return "REAL"
    if pa.types.is_float64(t):
        return "DOUBLE PRECISION" if dialect == "postgres" else "DOUBLE"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "TEXT" if dialect == "postgres" else "VARCHAR"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "BYTEA" if dialect == "postgres" else "BLOB"
    if pa.types.is_date(t):
        return "DATE"
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ" if t.tz else "TIMESTAMP"
    if pa.types.is_decimal(t):
        return (
            f"NUMERIC({t.precision}, {t.scale})"
            if dialect == "postgres"
            else f"DECIMAL({t.precision}, {t.scale})"
        )
    raise InvalidArgument(f"no {dialect} column type for Arrow type {t}")


def apply_additive(source: SourceRef, changes: Sequence[Additive]) -> bool:
    """Apply ``changes`` to ``source``; False when its kind needs no DDL."""
    if not changes:
        return False
    if source.kind == "postgres":
        _postgres(source, changes)
    elif source.kind == "iceberg":
        _iceberg(source, changes)
    elif source.kind == "ducklake":
        _ducklake(source, changes)
    else:
        return False
    return True


def _postgres(source: SourceRef, changes: Sequence[Additive]) -> None:
    import psycopg

    from planners.postgres import table_names

    schema, table, history = table_names(source.config)
    with psycopg.connect(str(source.config["dsn"])) as conn, conn.transaction():
        existing = {
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
                (schema, table),
            )
        }
        for t in (table, history):
            target = f"{quote_ident(schema)}.{quote_ident(t)}"
            for c in changes:
                sql_type = _sql_type(c.type, "postgres")
                if c.op == "add":
                    conn.execute(
                        f"ALTER TABLE {target} ADD COLUMN IF NOT EXISTS {quote_ident(c.names[0])} {sql_type}"
                    )
                else:
                    phys = next((n for n in c.names if n in existing), None)
                    if phys is not None:
                        conn.execute(
                            f"ALTER TABLE {target} ALTER COLUMN {quote_ident(phys)} TYPE {sql_type}"
                        )


def _iceberg(source: SourceRef, changes: Sequence[Additive]) -> None:
    from planners.iceberg import load_table

    table = load_table(source.config)
    names = {f.name for f in table.schema().fields}
    fields = []
    for c in changes:
        phys = next((n for n in c.names if n in names), None)
        if c.op == "add" and phys is None:
            fields.append(pa.field(c.names[0], c.type, nullable=True))
        elif c.op == "widen" and phys is not None:
            fields.append(pa.field(phys, c.type, nullable=True))
    if fields:
        # union_by_name adds missing columns and promotes types (int -> long, float -> double,
        # decimal precision up), as Iceberg's evolution rules allow.
        with table.update_schema() as update:
            update.union_by_name(pa.schema(fields))


def _ducklake(source: SourceRef, changes: Sequence[Additive]) -> None:
    from planners.ducklake import connect, table_ref

    con = connect(source.config, read_only=False)
    try:
        target = table_ref(source.config)
        existing = {d[0] for d in con.execute(f"SELECT * FROM {target} LIMIT 0").description}
        for c in changes:
            sql_type = _sql_type(c.type, "duckdb")
            phys = next((n for n in c.names if n in existing), None)
            if c.op == "add" and phys is None:
                con.execute(f"ALTER TABLE {target} ADD COLUMN {quote_ident(c.names[0])} {sql_type}")
            elif c.op == "widen" and phys is not None:
                con.execute(f"ALTER TABLE {target} ALTER {quote_ident(phys)} TYPE {sql_type}")
    finally:
        con.close()
