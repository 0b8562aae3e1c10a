"""Source pruning: can a source whose partition values are known hold matching rows?

Evaluates the predicate over the partition values with four outcomes: TRUE, FALSE, NULL (SQL
NULL) and UNKNOWN (the column is not a partition column of this source, so any value is
possible). A source is pruned only when the result is certainly FALSE or NULL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from planners.predicates.ast import And, Between, Cmp, Const, Expr, In, IsNull, Not, Or, StartsWith
from planners.predicates.literals import coerce


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()
_OPS = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def can_match(expr: Expr | None, partition: Mapping[str, Any], schema: pa.Schema) -> bool:
    """False only when no row of a source with these partition values can satisfy ``expr``."""
    if expr is None or not partition:
        return True
    values: dict[str, Any] = {}
    for col, raw in partition.items():
        if schema.get_field_index(col) < 0:
            continue
        try:
            values[col] = coerce(raw, schema.field(col).type, from_string=isinstance(raw, str))
        except ValueError:
            continue  # a value we cannot interpret never prunes
    result = _eval(expr, values)
    return not (result is False or result is None)


def _eval(e: Expr, values: Mapping[str, Any]) -> Any:
    if isinstance(e, And):
        results = [_eval(i, values) for i in e.items]
        if any(r is False for r in results):
            return False
        if any(r is UNKNOWN for r in results):
            return UNKNOWN
        return None if any(r is None for r in results) else True
    if isinstance(e, Or):
        results = [_eval(i, values) for i in e.items]
        if any(r is True for r in results):
            return True
        if any(r is UNKNOWN for r in results):
            return UNKNOWN
        return None if any(r is None for r in results) else False
    if isinstance(e, Not):
        r = _eval(e.item, values)
        return r if r is None or r is UNKNOWN else not r
    if isinstance(e, Const):
        return e.value
    if e.column not in values:
        return UNKNOWN
    v = values[e.column]
    try:
        if isinstance(e, IsNull):
            return v is None
        if v is None:
            return None
        if isinstance(e, Cmp):
            return None if e.value is None else _OPS[e.op](v, e.value)
        if isinstance(e, In):
            if any(x is not None and v == x for x in e.values):
                return True
            return None if any(x is None for x in e.values) else False
        if isinstance(e, Between):
            if e.low is None or e.high is None:
                return UNKNOWN
            return e.low <= v <= e.high
        if isinstance(e, StartsWith):
            return isinstance(v, str) and v.startswith(e.prefix)
    except TypeError:
        return UNKNOWN
    return UNKNOWN
