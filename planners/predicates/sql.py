"""AST -> a parameterised SQL WHERE clause for DuckDB and PostgreSQL.

Identifiers are always quoted and literals always bound as parameters: user text never
becomes SQL text.
"""

from __future__ import annotations

from typing import Any

from planners.predicates.ast import And, Between, Cmp, Const, Expr, In, IsNull, Not, Or, StartsWith


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def to_sql(expr: Expr, placeholder: str = "?", first_param: int = 1) -> tuple[str, list[Any]]:
    """Return ``(sql, params)``; ``placeholder`` is ``?`` (DuckDB), ``%s`` (psycopg) or ``$``
    (numbered ``$n`` from ``first_param``, for libpq/ADBC)."""
    params: list[Any] = []

    def bind(value: Any) -> str:
        params.append(value)
        if placeholder == "$":
            return f"${first_param + len(params) - 1}"
        return placeholder

    def go(e: Expr) -> str:
        if isinstance(e, Cmp):
            op = "<>" if e.op == "!=" else e.op
            if e.value is None:
                return "(NULL::BOOLEAN)"
            return f"({quote_ident(e.column)} {op} {bind(e.value)})"
        if isinstance(e, In):
            items = ", ".join("NULL" if v is None else bind(v) for v in e.values)
            return f"({quote_ident(e.column)} IN ({items}))"
        if isinstance(e, Between):
            lo = "NULL" if e.low is None else bind(e.low)
            hi = "NULL" if e.high is None else bind(e.high)
            return f"({quote_ident(e.column)} BETWEEN {lo} AND {hi})"
        if isinstance(e, IsNull):
            return f"({quote_ident(e.column)} IS NULL)"
        if isinstance(e, StartsWith):
            # starts_with avoids LIKE wildcards in the prefix; Postgres spells it ^@.
            arg = bind(e.prefix)
            if placeholder in ("%s", "$"):
                return f"({quote_ident(e.column)} ^@ {arg})"
            return f"starts_with({quote_ident(e.column)}, {arg})"
        if isinstance(e, And):
            return "(" + " AND ".join(go(i) for i in e.items) + ")"
        if isinstance(e, Or):
            return "(" + " OR ".join(go(i) for i in e.items) + ")"
        if isinstance(e, Not):
            return f"(NOT {go(e.item)})"
        if isinstance(e, Const):
            return "TRUE" if e.value else "FALSE"
        raise TypeError(f"not a predicate node: {e!r}")

    return go(expr), params
