"""AST -> a SQL WHERE clause for DuckDB and PostgreSQL.

Identifiers are always quoted. Values are bound as parameters, or, where a statement must carry
none (``inline``: Postgres reads, which ADBC then streams through COPY, and DuckDB's
``postgres_query``), written by ``postgres_literal``: user text never becomes SQL syntax.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planners.predicates.ast import And, Between, Cmp, Const, Expr, In, IsNull, Not, Or, StartsWith


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def to_sql(
    expr: Expr,
    placeholder: str = "?",
    first_param: int = 1,
    inline: Callable[[Any], str] | None = None,
) -> tuple[str, list[Any]]:
    """Return ``(sql, params)``; ``placeholder`` is ``?`` (DuckDB), ``%s`` (psycopg) or ``$``
    (numbered ``$n`` from ``first_param``, for libpq/ADBC). With ``inline`` (for SQL that cannot
    carry parameters, such as DuckDB's ``postgres_query``), each value is written by it as a
    literal instead and ``params`` stays empty."""
    params: list[Any] = []

    def bind(value: Any) -> str:
        if isinstance(value, float) and value == 0.0:
            # -0.0 equals 0.0 in SQL, but DuckDB's IN with a -0.0 parameter misses 0.0 rows
            # (found by the coercion property test): bind the zero every engine agrees on.
            value = 0.0
        if inline is not None:
            return inline(value)
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


def postgres_literal(value: Any) -> str:
    """``value`` as a PostgreSQL literal of its type. Strings use the escape-string form
    (``E'...'``), whose meaning does not depend on ``standard_conforming_strings``."""
    import datetime
    import decimal
    import math

    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return f"({int(value)})"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return f"'{value}'::float8"
        return f"({value!r}::float8)"
    if isinstance(value, decimal.Decimal):
        return f"'{value}'::numeric"
    if isinstance(value, datetime.datetime):
        cast = "timestamptz" if value.tzinfo is not None else "timestamp"
        return f"'{value.isoformat()}'::{cast}"
    if isinstance(value, datetime.date):
        return f"'{value.isoformat()}'::date"
    if isinstance(value, str):
        if "\0" in value:
            raise ValueError("PostgreSQL text cannot hold NUL")
        # Typed as text, as a bound text parameter was: comparisons keep text semantics (a
        # char(n) or citext column compares as it did, not by an untyped literal's rules).
        return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'::text"
    if isinstance(value, bytes):
        return f"E'\\\\x{value.hex()}'::bytea"
    raise ValueError(f"no PostgreSQL literal for {type(value).__name__}")
