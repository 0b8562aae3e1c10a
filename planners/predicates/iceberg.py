"""AST -> pyiceberg row filter, for file and row-group pruning inside pyiceberg.

Iceberg's own null semantics differ from SQL's under NOT, so the gateway still applies the
exact pyarrow residual after an Iceberg scan; this filter only has to never drop a matching row.
Parts that cannot be expressed safely become AlwaysTrue (prune nothing).
"""

from __future__ import annotations

from typing import Any

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


def to_iceberg(expr: Expr | None) -> Any:
    from pyiceberg import expressions

    # pydantic models whose positional constructors mypy cannot see
    ie: Any = expressions

    def go(e: Expr, negated: bool) -> Any:
        # Push NOT down ourselves so we never rely on Iceberg's NOT-over-null semantics.
        if isinstance(e, Not):
            return go(e.item, not negated)
        if isinstance(e, And):
            parts = [go(i, negated) for i in e.items]
            return fold_pairwise(parts, ie.Or if negated else ie.And)
        if isinstance(e, Or):
            parts = [go(i, negated) for i in e.items]
            return fold_pairwise(parts, ie.And if negated else ie.Or)
        if isinstance(e, Const):
            return ie.AlwaysTrue() if e.value != negated else ie.AlwaysFalse()
        if isinstance(e, IsNull):
            return ie.NotNull(e.column) if negated else ie.IsNull(e.column)
        if isinstance(e, Cmp):
            if e.value is None:
                return ie.AlwaysFalse()  # NULL comparisons never match, negated or not
            op = (
                {"=": "!=", "!=": "=", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}[e.op]
                if negated
                else e.op
            )
            cls = {
                "=": ie.EqualTo,
                "!=": ie.NotEqualTo,
                "<": ie.LessThan,
                "<=": ie.LessThanOrEqual,
                ">": ie.GreaterThan,
                ">=": ie.GreaterThanOrEqual,
            }[op]
            return cls(e.column, e.value)
        if isinstance(e, In):
            present = [v for v in e.values if v is not None]
            if negated:
                # NOT IN with a NULL in the list matches nothing.
                return (
                    ie.AlwaysFalse()
                    if len(present) < len(e.values)
                    else ie.NotIn(e.column, present)
                )
            if not present:
                return ie.AlwaysFalse()
            # pyiceberg filters the rows it reads with pyarrow's is_in, which matches floats
            # by hash: 0.0 never finds -0.0 (equal in SQL). Zero is compared instead.
            rest = [v for v in present if not (isinstance(v, float) and v == 0)]
            if len(rest) == len(present):
                return ie.In(e.column, present)
            zero = ie.EqualTo(e.column, 0.0)
            return ie.Or(zero, ie.In(e.column, rest)) if rest else zero
        if isinstance(e, Between):
            if e.low is None or e.high is None:
                return ie.AlwaysTrue()
            if negated:
                return ie.Or(ie.LessThan(e.column, e.low), ie.GreaterThan(e.column, e.high))
            return ie.And(
                ie.GreaterThanOrEqual(e.column, e.low), ie.LessThanOrEqual(e.column, e.high)
            )
        if isinstance(e, StartsWith):
            return (
                ie.NotStartsWith(e.column, e.prefix)
                if negated
                else ie.StartsWith(e.column, e.prefix)
            )
        return ie.AlwaysTrue()

    if expr is None:
        return ie.AlwaysTrue()
    return go(expr, False)
