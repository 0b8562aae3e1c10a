"""A small typed predicate AST: what a harness ``filter`` may say.

Comparisons are always ``column <op> literal`` (the parser flips ``1 < a``). Literals are Python
values already coerced to the column's type (int, float, Decimal, str, bytes, bool, date,
datetime, or None for SQL NULL).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

T = TypeVar("T")

COMPARISONS = ("=", "!=", "<", "<=", ">", ">=")
FLIP = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


@dataclass(frozen=True)
class Cmp:
    op: str
    column: str
    value: Any


@dataclass(frozen=True)
class In:
    column: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Between:
    column: str
    low: Any
    high: Any


@dataclass(frozen=True)
class IsNull:
    column: str


@dataclass(frozen=True)
class StartsWith:
    """``column LIKE 'prefix%'``."""

    column: str
    prefix: str


@dataclass(frozen=True)
class And:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Or:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Not:
    item: Expr


@dataclass(frozen=True)
class Const:
    value: bool


Expr = Cmp | In | Between | IsNull | StartsWith | And | Or | Not | Const


def columns(expr: Expr) -> set[str]:
    """Every column the expression references."""
    if isinstance(expr, (And, Or)):
        return set().union(*(columns(e) for e in expr.items))
    if isinstance(expr, Not):
        return columns(expr.item)
    if isinstance(expr, Const):
        return set()
    return {expr.column}


def rename(expr: Expr, mapping: Callable[[str], str]) -> Expr:
    """The same expression over renamed columns (harness name -> physical name)."""
    if isinstance(expr, And):
        return And(tuple(rename(e, mapping) for e in expr.items))
    if isinstance(expr, Or):
        return Or(tuple(rename(e, mapping) for e in expr.items))
    if isinstance(expr, Not):
        return Not(rename(expr.item, mapping))
    if isinstance(expr, Const):
        return expr
    return replace(expr, column=mapping(expr.column))


def conjuncts(expr: Expr | None) -> list[Expr]:
    """Top-level AND terms (an empty list for no filter)."""
    if expr is None:
        return []
    if isinstance(expr, And):
        return [c for e in expr.items for c in conjuncts(e)]
    return [expr]


def conjoin(items: list[Expr]) -> Expr | None:
    if not items:
        return None
    return items[0] if len(items) == 1 else And(tuple(items))


def fold_pairwise(items: Sequence[T], combine: Callable[[T, T], T]) -> T:
    """Combine ``items`` pairwise into a balanced tree, depth log2(n) rather than n: pyarrow and
    pyiceberg walk expressions recursively, and a generated chain may hold thousands of terms."""
    level = list(items)
    while len(level) > 1:
        paired = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        level = paired + ([level[-1]] if len(level) % 2 else [])
    return level[0]


def nan_safe(expr: Expr, floating: Collection[str]) -> tuple[Expr, bool]:
    """``expr`` for pruning by min/max statistics, and whether it is still exact.

    Parquet and Iceberg min/max bounds leave NaN out, yet pyarrow's row-group pruning and
    pyiceberg's file pruning read them as bounds of every non-null value. So a term over a
    float column that NaN satisfies (IEEE: ``x != 1``, ``NOT (x > 1)``, ``NOT (x = 1)``,
    ``NOT (x IN (..))``, ``NOT (x BETWEEN ..)``) would skip files and row groups whose NaN rows
    it matches. Here NOT is pushed down to the terms and each such term becomes TRUE; the result
    never rejects a row ``expr`` accepts, and is exact when no term was replaced (else the
    caller must apply ``expr`` to the rows itself). ``floating``: the float columns."""
    weakened = False

    def nan_matches(e: Expr, negated: bool) -> bool:
        if isinstance(e, Cmp):
            return e.value is not None and (e.op == "!=") != negated
        if isinstance(e, (In, Between)):
            return negated
        return False  # IS NULL is false for NaN, IS NOT NULL prunes by null counts only

    def go(e: Expr, negated: bool) -> Expr:
        nonlocal weakened
        if isinstance(e, Not):
            return go(e.item, not negated)
        if isinstance(e, (And, Or)):
            items = tuple(go(i, negated) for i in e.items)
            return Or(items) if isinstance(e, And) == negated else And(items)
        if isinstance(e, Const):
            return Const(e.value != negated)
        if isinstance(e, StartsWith) or e.column not in floating or not nan_matches(e, negated):
            return Not(e) if negated else e
        weakened = True
        return Const(True)

    out = go(expr, False)
    return out, not weakened
