"""Spark data source filters -> the harness filter grammar (SQL text the gateway parses).

Only filters the grammar expresses exactly are translated; the rest go back to Spark.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)


class Unsupported(Exception):
    pass


def _column(attr: tuple[str, ...]) -> str:
    if len(attr) != 1:
        raise Unsupported("nested column")
    return '"' + attr[0].replace('"', '""') + '"'


def _literal(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, (int, float, decimal.Decimal)):
        if isinstance(v, float) and v != v:  # NaN compares differently in SQL engines
            raise Unsupported("NaN")
        return repr(v) if not isinstance(v, decimal.Decimal) else str(v)
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(dt.UTC).replace(tzinfo=None)
        return f"TIMESTAMP '{v.isoformat(sep=' ')}'"
    if isinstance(v, dt.date):
        return f"DATE '{v.isoformat()}'"
    raise Unsupported(f"literal of type {type(v).__name__}")


_OPS = {
    EqualTo: "=",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
}


def to_filter_sql(f: Filter) -> str:
    """SQL for one Spark filter, or Unsupported."""
    for cls, op in _OPS.items():
        if isinstance(f, cls):
            if f.value is None:  # type: ignore[attr-defined]
                raise Unsupported("comparison with NULL")
            return f"{_column(f.attribute)} {op} {_literal(f.value)}"  # type: ignore[attr-defined]
    if isinstance(f, In):
        return f"{_column(f.attribute)} IN ({', '.join(_literal(v) for v in f.value)})"
    if isinstance(f, IsNull):
        return f"{_column(f.attribute)} IS NULL"
    if isinstance(f, IsNotNull):
        return f"{_column(f.attribute)} IS NOT NULL"
    if isinstance(f, StringStartsWith):
        if "%" in f.value or "_" in f.value:
            raise Unsupported("LIKE wildcard in prefix")
        return f"{_column(f.attribute)} LIKE {_literal(f.value + '%')}"
    if isinstance(f, Not):
        return f"NOT ({to_filter_sql(f.child)})"
    raise Unsupported(type(f).__name__)
