"""Parse a harness ``filter`` (a SQL boolean expression) into the typed AST.

Grammar: comparisons of a column with a literal, AND/OR/NOT, IN, BETWEEN, IS [NOT] NULL,
LIKE 'prefix%', TRUE/FALSE, and literals of the column types (numbers, strings, DATE '...',
TIMESTAMP '...'). Anything else is InvalidArgument naming the offending part. Column names are
case-sensitive; quote names that are not plain identifiers ("my col").
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pyarrow as pa
import sqlglot
from sqlglot import exp

from flight_gateway.errors import InvalidArgument
from planners.predicates.ast import (
    FLIP,
    And,
    Between,
    Cmp,
    Const,
    Expr,
    In,
    IsNull,
    Not,
    Or,
    StartsWith,
)

_CMP: dict[type[exp.Expression], str] = {
    exp.EQ: "=",
    exp.NEQ: "!=",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.GT: ">",
    exp.GTE: ">=",
}
MAX_FILTER_CHARS = 100_000


def parse_filter(text: str | None, schema: pa.Schema) -> Expr | None:
    """Parse and type-check ``text`` against ``schema``; None or blank means no filter."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if not isinstance(text, str):
        raise InvalidArgument(f"filter must be a SQL string, got {type(text).__name__}")
    if len(text) > MAX_FILTER_CHARS:
        raise InvalidArgument(f"filter is longer than {MAX_FILTER_CHARS} characters")
    try:
        tree: Any = sqlglot.parse_one(text)
    except sqlglot.errors.SqlglotError as e:
        raise InvalidArgument(f"cannot parse filter {text!r}: {e}") from e
    return _Converter(schema).convert(tree)


def _sql(node: exp.Expression) -> str:
    try:
        return node.sql()
    except Exception:
        return type(node).__name__


class _Converter:
    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def convert(self, node: exp.Expression) -> Expr:
        if isinstance(node, exp.Paren):
            return self.convert(node.this)
        if isinstance(node, exp.And):
            return And((self.convert(node.this), self.convert(node.expression)))
        if isinstance(node, exp.Or):
            return Or((self.convert(node.this), self.convert(node.expression)))
        if isinstance(node, exp.Not):
            return Not(self.convert(node.this))
        if isinstance(node, exp.Boolean):
            return Const(bool(node.this))
        if type(node) in _CMP:
            return self._comparison(node, _CMP[type(node)])
        if isinstance(node, exp.In):
            if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
                raise InvalidArgument(f"IN needs a list of literals: {_sql(node)!r}")
            col, ftype = self._column(node.this)
            values = tuple(self._literal(v, ftype, col) for v in node.expressions)
            if not values:
                raise InvalidArgument(f"IN list is empty in {_sql(node)!r}")
            return In(col, values)
        if isinstance(node, exp.Between):
            col, ftype = self._column(node.this)
            return Between(
                col,
                self._literal(node.args["low"], ftype, col),
                self._literal(node.args["high"], ftype, col),
            )
        if isinstance(node, exp.Is):
            col, _ = self._column(node.this)
            if not isinstance(node.expression, exp.Null):
                raise InvalidArgument(f"only IS [NOT] NULL is supported: {_sql(node)!r}")
            return IsNull(col)
        if isinstance(node, exp.Like):
            return self._like(node)
        raise InvalidArgument(
            f"unsupported filter expression {_sql(node)!r} ({type(node).__name__}); allowed: "
            "comparisons with literals, AND/OR/NOT, IN, BETWEEN, IS [NOT] NULL, LIKE 'prefix%'"
        )

    def _column(self, node: exp.Expression) -> tuple[str, pa.DataType]:
        if not isinstance(node, exp.Column) or node.table:
            raise InvalidArgument(f"expected a column name, got {_sql(node)!r}")
        name = node.name
        idx = self.schema.get_field_index(name)
        if idx < 0:
            raise InvalidArgument(
                f"unknown column {name!r} in filter (columns: {self.schema.names})"
            )
        return name, self.schema.field(idx).type

    def _comparison(self, node: exp.Expression, op: str) -> Expr:
        left, right = node.this, node.expression
        if isinstance(left, exp.Column) and isinstance(right, exp.Column):
            raise InvalidArgument(
                f"comparisons must be between a column and a literal: {_sql(node)!r}"
            )
        if not isinstance(left, exp.Column) and not isinstance(right, exp.Column):
            raise InvalidArgument(
                f"unsupported filter expression {_sql(node)!r}: comparisons must be between a "
                "column and a literal"
            )
        if not isinstance(left, exp.Column):
            left, right, op = right, left, FLIP[op]
        col, ftype = self._column(left)
        return Cmp(op, col, self._literal(right, ftype, col))

    def _like(self, node: exp.Like) -> Expr:
        col, ftype = self._column(node.this)
        if not (pa.types.is_string(ftype) or pa.types.is_large_string(ftype)):
            raise InvalidArgument(f"LIKE needs a string column; {col!r} is {ftype}")
        pattern = node.expression
        if node.args.get("escape") or not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise InvalidArgument(f"LIKE needs a string literal pattern: {_sql(node)!r}")
        text = pattern.this
        body = text[:-1] if text.endswith("%") else text
        if "%" in body or "_" in body:
            raise InvalidArgument(
                f"only LIKE 'prefix%' patterns are supported (no inner % or _): {text!r}"
            )
        out: Expr = StartsWith(col, body) if text.endswith("%") else Cmp("=", col, body)
        return Not(out) if node.args.get("negate") else out

    def _literal(self, node: exp.Expression, ftype: pa.DataType, col: str) -> Any:
        if isinstance(node, exp.Paren):
            return self._literal(node.this, ftype, col)
        if isinstance(node, exp.Null):
            return None
        if (
            isinstance(node, exp.Neg)
            and isinstance(node.this, exp.Literal)
            and not node.this.is_string
        ):
            raw: Any = "-" + node.this.this
            is_string = False
        elif isinstance(node, exp.Literal):
            raw, is_string = node.this, node.is_string
        elif isinstance(node, exp.Boolean):
            if not pa.types.is_boolean(ftype):
                raise InvalidArgument(f"column {col!r} is {ftype}, not boolean")
            return bool(node.this)
        elif (
            isinstance(node, exp.Cast)
            and isinstance(node.this, exp.Literal)
            and node.this.is_string
        ):
            raw, is_string = node.this.this, True  # DATE '...' / TIMESTAMP '...'
        else:
            raise InvalidArgument(f"expected a literal for column {col!r}, got {_sql(node)!r}")
        try:
            return coerce(raw, ftype, from_string=is_string)
        except (ValueError, decimal.InvalidOperation, OverflowError) as e:
            raise InvalidArgument(
                f"literal {raw!r} does not fit column {col!r} of type {ftype}: {e}"
            ) from e


def _parse_datetime(text: str, tz: str | None) -> dt.datetime:
    value = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if tz is not None:
        value = value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
    elif value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def coerce(raw: Any, ftype: pa.DataType, *, from_string: bool = True) -> Any:
    """Turn a literal (or a JSON partition value) into the Python value of type ``ftype``.

    Raises ValueError when it does not fit, so ``'abc'`` never compares with an int column.
    """
    if raw is None:
        return None
    t = ftype
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        if not isinstance(raw, str) or not from_string:
            raise ValueError("expected a string literal")
        return raw
    if pa.types.is_boolean(t):
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        raise ValueError("expected TRUE or FALSE")
    if (
        isinstance(raw, str)
        and from_string
        and (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))
    ):
        raise ValueError("expected a number, not a string")
    if pa.types.is_integer(t):
        if isinstance(raw, float) or (isinstance(raw, str) and not raw.lstrip("-").isdigit()):
            raise ValueError("expected an integer")
        value = int(raw)
        try:
            pa.scalar(value, t)  # range check
        except (pa.ArrowInvalid, OverflowError) as e:
            raise ValueError(f"out of range for {t}") from e
        return value
    if pa.types.is_floating(t):
        return float(raw)
    if pa.types.is_decimal(t):
        number = decimal.Decimal(str(raw))
        try:
            pa.scalar(number, t)
        except (pa.ArrowInvalid, OverflowError) as e:
            raise ValueError(f"does not fit {t}") from e
        return number
    if pa.types.is_timestamp(t):
        if not isinstance(raw, str):
            raise ValueError("expected a timestamp string")
        return _parse_datetime(raw, t.tz)
    if pa.types.is_date(t):
        if not isinstance(raw, str):
            raise ValueError("expected a date string")
        return dt.date.fromisoformat(raw.strip()[:10])
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return raw.encode() if isinstance(raw, str) else bytes(raw)
    raise ValueError(f"filters on {t} columns are not supported")
