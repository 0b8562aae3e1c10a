"""Arrow types as SQL column types, for kinds that apply schema changes with DDL."""

from __future__ import annotations

import pyarrow as pa

from flight_gateway.protocol.errors import InvalidArgument

# (PostgreSQL spelling, DuckDB spelling) where they differ.
_FLOAT64 = ("DOUBLE PRECISION", "DOUBLE")
_STRING = ("TEXT", "VARCHAR")
_BINARY = ("BYTEA", "BLOB")


def sql_type(t: pa.DataType, *, postgres: bool) -> str:
    """The column type of ``t`` in PostgreSQL (``postgres=True``) or DuckDB."""
    pick = 0 if postgres else 1
    checks: list[tuple[bool, str]] = [
        (pa.types.is_boolean(t), "BOOLEAN"),
        (pa.types.is_int8(t) or pa.types.is_int16(t), "SMALLINT"),
        (pa.types.is_int32(t), "INTEGER"),
        (pa.types.is_int64(t), "BIGINT"),
        (pa.types.is_float32(t), "REAL"),
        (pa.types.is_float64(t), _FLOAT64[pick]),
        (pa.types.is_string(t) or pa.types.is_large_string(t), _STRING[pick]),
        (pa.types.is_binary(t) or pa.types.is_large_binary(t), _BINARY[pick]),
        (pa.types.is_date(t), "DATE"),
    ]
    for ok, name in checks:
        if ok:
            return name
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ" if t.tz else "TIMESTAMP"
    if pa.types.is_decimal(t):
        return f"{'NUMERIC' if postgres else 'DECIMAL'}({t.precision}, {t.scale})"
    raise InvalidArgument(f"no {'PostgreSQL' if postgres else 'DuckDB'} column type for {t}")
