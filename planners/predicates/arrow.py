"""AST -> pyarrow compute expression with SQL three-valued logic.

The result is null wherever SQL's would be NULL, so ``NOT`` over it behaves as in SQL and a
dataset/Table filter keeps exactly the rows a SQL ``WHERE`` keeps.
"""

from __future__ import annotations

import functools
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from planners.predicates.ast import (
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
    fold_pairwise,
)


@functools.cache
def _null_bool() -> pc.Expression:
    """A null boolean literal, made on first use: pyarrow imports pandas the first time it makes
    a literal expression (~0.2 s), which every process importing the predicates (the gateway,
    its read processes, clients) paid at start-up, for a literal most never use."""
    return pc.scalar(pa.scalar(None, pa.bool_()))


def _lit(value: Any, ftype: pa.DataType | None) -> pc.Expression:
    """The literal typed like its column when that loses nothing (so Parquet statistics prune
    without a cast), else in its own type: the parser gives values of the harness column type,
    but a file may store a narrower type (float32 under a double column, int32 under int64),
    and ``pa.scalar(0.1, float32)`` would silently compare with 0.1f instead of 0.1."""
    if ftype is not None and value is not None:
        try:
            typed = pa.scalar(value, ftype)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError):
            typed = None
        if typed is not None and typed.as_py() == value:
            return pc.scalar(typed)
    return pc.scalar(value)


def _member(f: pc.Expression, values: list[Any], ftype: pa.DataType | None) -> pc.Expression:
    """``f IN (values)`` for non-null values, with SQL's equality."""
    if not values:
        return pc.scalar(False)
    try:
        value_set = pa.array(values, type=ftype)
        exact = value_set.to_pylist() == values
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError):
        exact = False
    if not exact:  # the column's type cannot hold them (a narrower type in a file)
        return fold_pairwise([f == _lit(v, ftype) for v in values], lambda a, b: a | b)
    if not any(isinstance(v, float) and v == 0 for v in values):
        return pc.is_in(f, value_set=value_set)
    # is_in matches floats by hash, so 0.0 never finds -0.0 (equal in SQL), and pyarrow 26
    # skips Parquet row groups of zeros (statistics min -0.0, max 0.0) for is_in: compare.
    rest = [v for v in values if v != 0]
    zero = f == _lit(0.0, ftype)
    return zero if not rest else pc.is_in(f, value_set=pa.array(rest, type=ftype)) | zero


def to_arrow(expr: Expr, schema: pa.Schema | None = None) -> pc.Expression:
    """Translate ``expr``; ``schema`` (when given) types the literals like their columns."""

    def ftype(col: str) -> pa.DataType | None:
        if schema is None or schema.get_field_index(col) < 0:
            return None
        return schema.field(col).type

    def go(e: Expr) -> pc.Expression:
        if isinstance(e, Cmp):
            if e.value is None:
                return _null_bool()
            f, v = pc.field(e.column), _lit(e.value, ftype(e.column))
            return {
                "=": f == v,
                "!=": f != v,
                "<": f < v,
                "<=": f <= v,
                ">": f > v,
                ">=": f >= v,
            }[e.op]
        if isinstance(e, In):
            f = pc.field(e.column)
            present = [v for v in e.values if v is not None]
            hit = _member(f, present, ftype(e.column))
            if len(present) < len(e.values):
                # x IN (.., NULL) is TRUE on a match and NULL otherwise.
                hit = pc.if_else(hit, pc.scalar(True), _null_bool())
            # NULL IN (...) is NULL, where is_in would say false.
            return pc.if_else(pc.is_null(f), _null_bool(), hit)
        if isinstance(e, Between):
            t = ftype(e.column)
            f = pc.field(e.column)
            lo = _null_bool() if e.low is None else f >= _lit(e.low, t)
            hi = _null_bool() if e.high is None else f <= _lit(e.high, t)
            return lo & hi
        if isinstance(e, IsNull):
            return pc.is_null(pc.field(e.column))
        if isinstance(e, StartsWith):
            return pc.starts_with(pc.field(e.column), pattern=e.prefix)
        if isinstance(e, And):
            return fold_pairwise([go(i) for i in e.items], lambda a, b: a & b)
        if isinstance(e, Or):
            return fold_pairwise([go(i) for i in e.items], lambda a, b: a | b)
        if isinstance(e, Not):
            return ~go(e.item)
        if isinstance(e, Const):
            return pc.scalar(e.value)
        raise TypeError(f"not a predicate node: {e!r}")

    return go(expr)
