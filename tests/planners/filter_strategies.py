"""Hypothesis strategies: harness filters whose literals often have another type than their
column (int vs decimal, decimal vs float, date vs timestamp), for the DuckDB property tests of
the planners and of the gateway. DuckDB, running the same SQL, is the oracle."""

from __future__ import annotations

from hypothesis import strategies as st

# Literal spellings per column kind. Exponent literals (DOUBLE in DuckDB) stay small and short,
# where DuckDB's double comparison and the harness's exact one agree (see literals.py).
LITERALS: dict[str, list[str]] = {
    "int": [
        "-3",
        "0",
        "1",
        "2",
        "3",
        "2.5",
        "-1.5",
        "2.0",
        "0.5",
        "2.5e0",
        "1e0",
        "-2E0",
        "3000000000",
        "-3000000000",
        "9223372036854775808",
    ],
    "float": [
        "-1.5",
        "0",
        "-0.0",
        "0.5",
        "2",
        "0.1",
        "0.10",
        "1e-1",
        "5e-1",
        "2.0e0",
        "3",
        "0.10000000149011612",
    ],
    "decimal": [
        "24",
        "23.99",
        "23.999",
        "24.005",
        "23.5",
        "-1",
        "-0.001",
        "0",
        "2.4e1",
        "1e20",
        "-1e20",
        "23.99000",
    ],
    "date": [
        "DATE '2024-01-02'",
        "DATE '2024-01-04'",
        "TIMESTAMP '2024-01-02 00:00:00'",
        "TIMESTAMP '2024-01-02 12:00:00'",
        "TIMESTAMP '2024-01-03 23:59:59.999999'",
        "'2024-01-03'",
        "'2024-01-02 12:00:00'",
    ],
    "timestamp": [
        "TIMESTAMP '2024-01-02 00:00:00'",
        "TIMESTAMP '2024-01-02 12:00:00'",
        "TIMESTAMP '2024-01-02 23:59:59.999999'",
        "TIMESTAMP '2024-01-02 12:00:00.000001'",
        "DATE '2024-01-02'",
        "DATE '2024-01-03'",
        "'2024-01-02 12:00:00'",
        "'2024-01-03'",
    ],
    "string": ["''", "'a'", "'ab'", "'abc'", "'b'", "'ba'"],
}
LIKE_PREFIXES = ["", "a", "ab", "b"]


def literal(kind: str) -> st.SearchStrategy[str]:
    return st.just("NULL") | st.sampled_from(LITERALS[kind])


@st.composite
def atom(draw: st.DrawFn, columns: dict[str, str]) -> str:
    """One predicate over ``columns`` (name -> kind, a key of LITERALS)."""
    col = draw(st.sampled_from(sorted(columns)))
    lit = literal(columns[col])
    kind = draw(st.sampled_from(["cmp", "cmp", "in", "between", "null", "like", "const"]))
    if kind == "cmp":
        op = draw(st.sampled_from(["=", "!=", "<>", "<", "<=", ">", ">="]))
        if draw(st.booleans()):
            return f"{col} {op} {draw(lit)}"
        return f"{draw(lit)} {op} {col}"  # literal on the left
    if kind == "in":
        items = draw(st.lists(lit, min_size=1, max_size=3))
        neg = "NOT " if draw(st.booleans()) else ""
        return f"{col} {neg}IN ({', '.join(items)})"
    if kind == "between":
        neg = "NOT " if draw(st.booleans()) else ""
        return f"{col} {neg}BETWEEN {draw(lit)} AND {draw(lit)}"
    if kind == "null":
        return f"{col} IS {'NOT ' if draw(st.booleans()) else ''}NULL"
    strings = [c for c, k in columns.items() if k == "string"]
    if kind == "like" and strings:
        neg = "NOT " if draw(st.booleans()) else ""
        return (
            f"{draw(st.sampled_from(strings))} {neg}LIKE '{draw(st.sampled_from(LIKE_PREFIXES))}%'"
        )
    return draw(st.sampled_from(["TRUE", "FALSE"]))


def filters(columns: dict[str, str]) -> st.SearchStrategy[str]:
    # Mostly shallow: deep trees mask NULL-handling differences behind AND/OR.
    return atom(columns) | st.recursive(
        atom(columns),
        lambda inner: st.one_of(
            st.tuples(inner, inner).map(lambda t: f"({t[0]} AND {t[1]})"),
            st.tuples(inner, inner).map(lambda t: f"({t[0]} OR {t[1]})"),
            inner.map(lambda e: f"NOT ({e})"),
        ),
        max_leaves=4,
    )
