"""Parse a harness ``filter`` (a SQL boolean expression) into the typed AST.

Grammar: comparisons of a column with a literal, AND/OR/NOT, IN, BETWEEN, IS [NOT] NULL,
LIKE 'prefix%', TRUE/FALSE, and literals comparable with the column types (numbers, strings,
DATE '...', TIMESTAMP '...'). Anything else is InvalidArgument naming the offending part. Column
names are case-sensitive; quote names that are not plain identifiers ("my col"). Literals of
another type than their column are compared as SQL does (see ``literals``).

Nesting is bounded: AND, OR and NOT may nest at most ``MAX_FILTER_DEPTH`` levels. A chain of one
operator (``a = 1 OR a = 2 OR ...``, which sqlglot parses as a left-deep tree) is one level
however long it is, so long generated filters work; the bound keeps every translation's
recursion small.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
from typing import Any

import pyarrow as pa
import sqlglot
from sqlglot import exp

from flight_gateway.protocol.errors import InvalidArgument
from planners.predicates import literals as L
from planners.predicates.ast import FLIP, And, Cmp, Const, Expr, In, IsNull, Not, Or, StartsWith
from planners.predicates.literals import coerce

__all__ = ["MAX_FILTER_CHARS", "MAX_FILTER_DEPTH", "coerce", "parse_filter"]

_CMP: dict[type[exp.Expression], str] = {
    exp.EQ: "=",
    exp.NEQ: "!=",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.GT: ">",
    exp.GTE: ">=",
}
MAX_FILTER_CHARS = 100_000
# sqlglot's parser recurses about 20 Python frames per parenthesis (Python allows 1,000 by
# default), so it manages about 45 nested parentheses; 32 levels of AND/OR/NOT leave it room.
MAX_FILTER_DEPTH = 32
_TIMESTAMP_TYPES = {
    exp.DataType.Type.TIMESTAMP,
    exp.DataType.Type.TIMESTAMPTZ,
    exp.DataType.Type.TIMESTAMPLTZ,
    exp.DataType.Type.TIMESTAMPNTZ,
    exp.DataType.Type.DATETIME,
}
_TOO_DEEP = (
    f"filter nests AND/OR/NOT more than {MAX_FILTER_DEPTH} levels deep; a chain of one "
    "operator (a = 1 OR a = 2 OR ...) is one level however long, and IN (...) lists are flat"
)
_TOO_DEEP_TO_PARSE = (
    "filter nests parentheses or operators too deeply to parse (more than "
    f"{MAX_FILTER_DEPTH} levels deep is refused)"
)


def parse_filter(text: str | None, schema: pa.Schema) -> Expr | None:
    """Parse and type-check ``text`` against ``schema``; None or blank means no filter."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if not isinstance(text, str):
        raise InvalidArgument(f"filter must be a SQL string, got {type(text).__name__}")
    if len(text) > MAX_FILTER_CHARS:
        raise InvalidArgument(f"filter is longer than {MAX_FILTER_CHARS} characters")
    return _parse(text, schema)


@functools.lru_cache(maxsize=32)
def _parse(text: str, schema: pa.Schema) -> Expr:
    """Cached: every endpoint of a read parses the same filter again when its ticket is served,
    and a generated filter of thousands of terms takes sqlglot about half a second. The AST is
    immutable, so sharing it is safe; errors are not cached."""
    too_deep = False
    try:
        tree: Any = sqlglot.parse_one(text)
    except sqlglot.errors.SqlglotError as e:
        raise InvalidArgument(f"cannot parse filter {text[:200]!r}: {e}") from e
    except RecursionError:
        # sqlglot's recursive descent gives up first on thousands of "(" or NOT. Raised outside
        # this block so the 1,000-frame traceback is not chained to it (see below).
        too_deep = True
    if too_deep:
        raise InvalidArgument(_TOO_DEEP_TO_PARSE)
    try:
        return _Converter(schema).convert(tree, 0)
    except InvalidArgument as e:
        message = str(e)
    # Raised again up here, without the converter's stack (up to 100 frames at the bound):
    # the server sends the traceback in the status details, and gRPC refuses metadata over
    # 16 KB, which would turn INVALID_ARGUMENT into RESOURCE_EXHAUSTED.
    raise InvalidArgument(message)


def _sql(node: exp.Expression) -> str:
    try:
        text = node.sql()
    except Exception:  # e.g. RecursionError on a huge tree: the type name still helps
        return type(node).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def _unparen(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _chain(node: exp.And | exp.Or) -> list[exp.Expression]:
    """The operands of a chain of one operator, left to right, without recursion (sqlglot
    nests ``a OR b OR c`` as ``(a OR b) OR c``; parentheses inside the chain do not matter)."""
    kind, out, stack = type(node), [], [node]
    while stack:
        item = _unparen(stack.pop())
        if type(item) is kind:
            stack += [item.expression, item.this]
        else:
            out.append(item)
    return out


def _merged(items: tuple[Expr, ...], conjunction: bool) -> Expr:
    """AND/OR with the (in)equalities on one column merged into one IN list:
    ``a = 1 OR a = 2`` is ``a IN (1, 2)`` and ``a <> 1 AND a <> 2`` is ``a NOT IN (1, 2)``, in
    SQL's three-valued logic too, and engines plan one IN list far faster than thousands of
    terms (DuckDB took 37 s to plan 5,000 ``"a" = ?`` ORs)."""
    values: dict[str, dict[Any, None]] = {}  # column -> values, in order, without repeats
    alone: dict[str, Expr | None] = {}  # column -> its only (in)equality, else None
    out: list[Expr | str] = []  # a column name stands for its merged (in)equalities
    for item in items:
        listed = _listed(item, conjunction)
        if listed is None:
            out.append(item)
            continue
        col, new = listed
        alone[col] = item if col not in values else None
        if col not in values:
            values[col] = {}
            out.append(col)
        values[col].update(dict.fromkeys(new))

    def merge(col: str) -> Expr:
        listed = In(col, tuple(values[col]))
        return alone[col] or (Not(listed) if conjunction else listed)

    merged = [merge(e) if isinstance(e, str) else e for e in out]
    if len(merged) == 1:
        return merged[0]
    return And(tuple(merged)) if conjunction else Or(tuple(merged))


def _listed(item: Expr, conjunction: bool) -> tuple[str, tuple[Any, ...]] | None:
    """(column, values) when ``item`` is ``column [NOT] IN (values)`` in disguise: an equality
    or IN for OR, an inequality or NOT IN for AND."""
    if conjunction and isinstance(item, Not):
        item, op = item.item, "="
    elif conjunction:
        op = "!="
    else:
        op = "="
    if isinstance(item, Cmp) and item.op == op:
        return item.column, (item.value,)
    if isinstance(item, In) and op == "=":
        return item.column, item.values
    return None


class _Converter:
    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def convert(self, node: exp.Expression, depth: int) -> Expr:
        """``node`` as an AST; ``depth`` counts the AND/OR/NOT levels around it."""
        node = _unparen(node)
        if isinstance(node, (exp.And, exp.Or, exp.Not)):
            if depth >= MAX_FILTER_DEPTH:
                raise InvalidArgument(_TOO_DEEP)
            if isinstance(node, exp.Not):
                return Not(self.convert(node.this, depth + 1))
            items = tuple(self.convert(item, depth + 1) for item in _chain(node))
            return _merged(items, conjunction=isinstance(node, exp.And))
        if isinstance(node, exp.Boolean):
            return Const(bool(node.this))
        if type(node) in _CMP:
            return self._comparison(node, _CMP[type(node)])
        if isinstance(node, exp.In):
            return self._in(node)
        if isinstance(node, exp.Between):
            col, ftype = self._column(node.this)
            low, high = node.args["low"], node.args["high"]
            lits = self._literal(low, col), self._literal(high, col)
            return self._typed(node, col, ftype, lambda: L.between(col, *lits, ftype))
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
        left, right = _unparen(node.this), _unparen(node.expression)
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
        lit = self._literal(right, col)
        return self._typed(node, col, ftype, lambda: L.compare(op, col, lit, ftype))

    def _in(self, node: exp.In) -> Expr:
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            raise InvalidArgument(f"IN needs a list of literals: {_sql(node)!r}")
        col, ftype = self._column(node.this)
        lits = [self._literal(v, col) for v in node.expressions]
        if not lits:
            raise InvalidArgument(f"IN list is empty in {_sql(node)!r}")
        return self._typed(node, col, ftype, lambda: L.in_list(col, lits, ftype))

    def _typed(self, node: exp.Expression, col: str, ftype: pa.DataType, build: Any) -> Expr:
        """``build()``, with a literal that cannot compare with the column as InvalidArgument."""
        try:
            result: Expr = build()
        except (ValueError, ArithmeticError) as e:  # decimal.InvalidOperation is one
            raise InvalidArgument(
                f"a literal in {_sql(node)!r} does not fit column {col!r} of type {ftype}: {e}"
            ) from e
        return result

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

    def _literal(self, node: exp.Expression, col: str) -> L.SqlLiteral | None:
        """The literal as written (None for NULL); its type is checked against the column's
        when the comparison is built."""
        node = _unparen(node)
        if isinstance(node, exp.Null):
            return None
        if isinstance(node, exp.Boolean):
            return L.SqlLiteral(L.BOOL, bool(node.this), _sql(node))
        negative = isinstance(node, exp.Neg)
        if negative and isinstance(node.this, exp.Literal) and not node.this.is_string:
            node = node.this
        if isinstance(node, exp.Literal):
            text = ("-" if negative else "") + str(node.this)
            if node.is_string:
                return L.SqlLiteral(L.STRING, node.this, text)
            kind = L.APPROX if "e" in text.lower() else L.EXACT
            try:
                return L.SqlLiteral(kind, decimal.Decimal(text), text)
            except decimal.InvalidOperation as e:
                raise InvalidArgument(f"bad number {text!r} for column {col!r}") from e
        if (
            isinstance(node, exp.Cast)
            and isinstance(node.this, exp.Literal)
            and node.this.is_string
        ):
            return self._typed_string(node, col)
        raise InvalidArgument(f"expected a literal for column {col!r}, got {_sql(node)!r}")

    def _typed_string(self, node: exp.Cast, col: str) -> L.SqlLiteral:
        """``DATE '...'`` and ``TIMESTAMP '...'``; other casts of a string stay strings."""
        text = str(node.this.this)
        target = node.to.this if isinstance(node.to, exp.DataType) else None
        try:
            if target == exp.DataType.Type.DATE:
                return L.SqlLiteral(L.DATE, dt.date.fromisoformat(text.strip()[:10]), text)
            if target in _TIMESTAMP_TYPES:
                return L.SqlLiteral(L.TIMESTAMP, L.parse_datetime(text), text)
        except ValueError as e:
            raise InvalidArgument(f"bad {target} literal {text!r} for column {col!r}: {e}") from e
        return L.SqlLiteral(L.STRING, text, text)
