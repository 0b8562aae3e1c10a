"""AST -> pyarrow compute expression with SQL three-valued logic.

The result is null wherever SQL's would be NULL, so ``NOT`` over it behaves as in SQL and a
dataset/Table filter keeps exactly the rows a SQL ``WHERE`` keeps.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from planners.predicates.ast import And, Between, Cmp, Const, Expr, In, IsNull, Not, Or, StartsWith

_NULL_BOOL = pc.scalar(pa.scalar(None, pa.bool_()))


def _lit(value: Any, ftype: pa.DataType | None) -> pc.Expression:
    if ftype is not None and value is not None:
        return pc.scalar(pa.scalar(value, ftype))
    return pc.scalar(value)


def to_arrow(expr: Expr, schema: pa.Schema | None = None) -> pc.Expression:
    """Translate ``expr``; ``schema`` (when given) types the literals like their columns."""

    def ftype(col: str) -> pa.DataType | None:
        if schema is None or schema.get_field_index(col) < 0:
            return None
        return schema.field(col).type

    def go(e: Expr) -> pc.Expression:
        if isinstance(e, Cmp):
            if e.value is None:
                return _NULL_BOOL
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
            t = ftype(e.column)
            hit = pc.is_in(f, value_set=pa.array(present, type=t)) if present else pc.scalar(False)
            if len(present) < len(e.values):
                # x IN (.., NULL) is TRUE on a match and NULL otherwise.
                hit = pc.if_else(hit, pc.scalar(True), _NULL_BOOL)
            # NULL IN (...) is NULL, where is_in would say false.
            return pc.if_else(pc.is_null(f), _NULL_BOOL, hit)
        if isinstance(e, Between):
            t = ftype(e.column)
            f = pc.field(e.column)
            lo = _NULL_BOOL if e.low is None else f >= _lit(e.low, t)
            hi = _NULL_BOOL if e.high is None else f <= _lit(e.high, t)
            return lo & hi
        if isinstance(e, IsNull):
            return pc.is_null(pc.field(e.column))
        if isinstance(e, StartsWith):
            return pc.starts_with(pc.field(e.column), pattern=e.prefix)
        if isinstance(e, And):
            out = go(e.items[0])
            for item in e.items[1:]:
                out = out & go(item)
            return out
        if isinstance(e, Or):
            out = go(e.items[0])
            for item in e.items[1:]:
                out = out | go(item)
            return out
        if isinstance(e, Not):
            return ~go(e.item)
        if isinstance(e, Const):
            return pc.scalar(e.value)
        raise TypeError(f"not a predicate node: {e!r}")

    return go(expr)
