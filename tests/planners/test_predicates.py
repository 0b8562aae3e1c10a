"""Predicate translations: pruning, SQL generation with hostile input."""

from __future__ import annotations

import datetime as dt
import decimal

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from flight_gateway.protocol.errors import InvalidArgument
from planners.predicates import can_match, parse_filter, to_arrow, to_sql
from planners.predicates.ast import And, Between, Cmp, In, Not, Or
from planners.predicates.iceberg import to_iceberg
from planners.predicates.parse import MAX_FILTER_DEPTH

SCHEMA = pa.schema(
    [("id", pa.int64()), ("region", pa.string()), ("day", pa.date32()), ('we"ird', pa.string())]
)


@pytest.mark.parametrize(
    ("flt", "partition", "expected"),
    [
        ("region = 'eu'", {"region": "eu"}, True),
        ("region = 'eu'", {"region": "us"}, False),
        ("region = 'eu' AND id > 5", {"region": "us"}, False),
        ("region = 'eu' OR id > 5", {"region": "us"}, True),  # id unknown: cannot prune
        ("NOT (region = 'eu')", {"region": "eu"}, False),
        ("region IN ('us', 'ap')", {"region": "eu"}, False),
        ("region IS NULL", {"region": "eu"}, False),
        ("region LIKE 'e%'", {"region": "us"}, False),
        ("day BETWEEN DATE '2024-01-01' AND DATE '2024-01-31'", {"day": "2024-02-01"}, False),
        ("day >= DATE '2024-01-01'", {"day": "2024-02-01"}, True),
        ("region = 'eu'", {}, True),
        ("region = 'eu'", {"region": None}, False),  # NULL = 'eu' is never true
        ("NOT (region = 'eu')", {"region": None}, False),
    ],
)
def test_pruning(flt: str, partition: dict, expected: bool) -> None:
    assert can_match(parse_filter(flt, SCHEMA), partition, SCHEMA) is expected


def test_sql_is_parameterised_and_quoted() -> None:
    evil = "x'; DROP TABLE t; --"
    expr = parse_filter(
        f"region = '{evil.replace(chr(39), chr(39) * 2)}' AND \"we\"\"ird\" LIKE 'a%'", SCHEMA
    )
    sql, params = to_sql(expr)
    assert "DROP" not in sql and evil in params
    assert '"we""ird"' in sql
    con = duckdb.connect()
    con.execute('CREATE TABLE t (id BIGINT, region VARCHAR, day DATE, "we""ird" VARCHAR)')
    con.execute("INSERT INTO t VALUES (1, ?, DATE '2024-01-01', 'ab')", [evil])
    assert con.execute(f"SELECT id FROM t WHERE {sql}", params).fetchall() == [(1,)]
    assert con.execute("SELECT count(*) FROM t").fetchone() == (1,)  # table still there


@pytest.mark.parametrize(
    "bad",
    [
        "id = (SELECT 1)",
        "id IN (SELECT id FROM t)",
        "region = 'a' UNION SELECT 1",
        "t.id = 1",
        "day = DATE 'not-a-date'",
        "region LIKE 'a_b%'",
        "region = id",
        # A literal no SQL comparison with the column type makes sense of.
        "id = '5'",
        "id IN (1, 'a')",
        "id BETWEEN 1 AND '5'",
        "id = DATE '2024-01-01'",
        "id = TRUE",
        "region = 5",
        "region = DATE '2024-01-01'",
        "day = 5",
        "day = TIMESTAMP 'not-a-time'",
    ],
)
def test_grammar_rejections(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_filter(bad, SCHEMA)


def test_literal_coercion() -> None:
    e = parse_filter("day = DATE '2024-01-02' AND id BETWEEN -3 AND 5", SCHEMA)
    assert e is not None
    sql, params = to_sql(e, "%s")
    assert params == [dt.date(2024, 1, 2), -3, 5] and "%s" in sql


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        # Out of the column's range, or finer than it: comparisons SQL evaluates exactly,
        # rewritten over values of the column type (INVALID_ARGUMENT before).
        ("id = 9223372036854775808", And((Cmp(">", "id", 2**63 - 1), Cmp("<=", "id", 2**63 - 1)))),
        ("id < 9223372036854775808", Cmp("<=", "id", 2**63 - 1)),
        ("id = 1.5", And((Cmp(">=", "id", 2), Cmp("<=", "id", 1)))),
        ("id != 1.5", Or((Cmp("<=", "id", 1), Cmp(">=", "id", 2)))),
        ("id < 1.5", Cmp("<=", "id", 1)),
        ("id < -1.5", Cmp("<=", "id", -2)),
        ("1.5 < id", Cmp(">=", "id", 2)),
        ("id = 2.0", Cmp("=", "id", 2)),
        ("id IN (1, 1.5, NULL)", In("id", (1, None))),
        ("id BETWEEN 0.5 AND 2.5", Between("id", 1, 2)),
        ("day < TIMESTAMP '2024-01-02 00:00:01'", Cmp("<=", "day", dt.date(2024, 1, 2))),
        ("day >= TIMESTAMP '2024-01-02 00:00:01'", Cmp(">=", "day", dt.date(2024, 1, 3))),
    ],
)
def test_mixed_type_comparisons_are_rewritten_exactly(flt: str, expected: object) -> None:
    assert parse_filter(flt, SCHEMA) == expected


def test_decimal_literals_take_the_column_scale() -> None:
    """pyiceberg refuses a Decimal of another scale than its column (the TPC-H Q6 failure)."""
    schema = pa.schema([("q", pa.decimal128(15, 2))])
    expr = parse_filter("q < 24", schema)
    assert expr == Cmp("<", "q", decimal.Decimal("24.00"))
    assert isinstance(expr, Cmp) and expr.value.as_tuple().exponent == -2


def test_in_list_with_zero_on_parquet(tmp_path) -> None:
    """pyarrow's is_in misses 0.0 in a Parquet row group of zeros (statistics -0.0..0.0) and
    never matches -0.0 with 0.0; SQL says 0.0 = -0.0."""
    data = pa.table({"x": pa.array([0.0, -0.0, None], pa.float64())})
    pq.write_table(data, tmp_path / "zeros.parquet")
    dataset = ds.dataset(tmp_path / "zeros.parquet")
    for flt, rows in [("x IN (0.0)", 2), ("x IN (-0.0, 5)", 2), ("x NOT IN (0.0)", 0)]:
        expr = parse_filter(flt, data.schema)
        assert expr is not None
        assert dataset.to_table(filter=to_arrow(expr, data.schema)).num_rows == rows, flt


def test_narrower_physical_type_compares_like_the_harness_type(tmp_path) -> None:
    """A file may store float32 under a double column: 0.1 is the double 0.1, never 0.1f."""
    pq.write_table(pa.table({"x": pa.array([0.1, 0.5], pa.float32())}), tmp_path / "f.parquet")
    dataset = ds.dataset(tmp_path / "f.parquet")
    harness = pa.schema([("x", pa.float64())])
    for flt in ("x = 0.1", "x IN (0.1, 7)"):
        expr = parse_filter(flt, harness)
        assert expr is not None
        got = dataset.to_table(filter=to_arrow(expr, dataset.schema))
        assert got.column("x").to_pylist() == [], flt


def test_equalities_on_one_column_merge_into_in_lists() -> None:
    """Same three-valued result, and engines plan one IN list far faster than 5,000 ORs."""
    expr = parse_filter("id = 1 OR region = 'eu' OR (id = 2 OR id IN (3, 1)) OR id = NULL", SCHEMA)
    assert expr == Or((In("id", (1, 2, 3, None)), Cmp("=", "region", "eu")))
    expr = parse_filter("id <> 1 AND NOT (id = 2) AND id NOT IN (3) AND id > 0", SCHEMA)
    assert expr == And((Not(In("id", (1, 2, 3))), Cmp(">", "id", 0)))
    assert parse_filter("id = 1 OR id > 5", SCHEMA) == Or((Cmp("=", "id", 1), Cmp(">", "id", 5)))


def _nots(n: int) -> str:
    return "NOT (" * n + "id = 1" + ")" * n


def test_nesting_is_bounded() -> None:
    expr = parse_filter(_nots(MAX_FILTER_DEPTH), SCHEMA)
    for _ in range(MAX_FILTER_DEPTH):
        assert isinstance(expr, Not)
        expr = expr.item
    assert expr == Cmp("=", "id", 1)
    for deep in (
        _nots(MAX_FILTER_DEPTH + 1),
        "id = 1 OR (id = 2 AND (" * 17 + "id = 3" + "))" * 17,  # 34 levels of AND/OR
        "NOT " * 3000 + "id = 1",  # RecursionError inside sqlglot's parser
        "(" * 3000 + "id = 1" + ")" * 3000,
        "id = " + "- " * 3000 + "1",  # unary minus: recursive in sqlglot too
    ):
        with pytest.raises(InvalidArgument, match="levels deep") as info:
            parse_filter(deep, SCHEMA)
        assert info.value.__cause__ is None and info.value.__context__ is None


def test_long_flat_chains_are_one_level() -> None:
    """sqlglot parses ``a OR b OR c ...`` left-deep: 5,000 terms must not count as nesting."""
    ranges = " OR ".join(f"(id > {3 * i} AND id < {3 * i + 2})" for i in range(2500))
    expr = parse_filter(f"(({ranges})) OR region = 'x'", SCHEMA)
    assert isinstance(expr, Or) and len(expr.items) == 2501
    data = pa.table({"id": list(range(10)), "region": ["y"] * 10, "day": [None] * 10})
    data = data.append_column('we"ird', pa.nulls(10, pa.string()))
    assert data.filter(to_arrow(expr, data.schema)).column("id").to_pylist() == [1, 4, 7]
    sql, params = to_sql(expr)
    con = duckdb.connect()
    con.register("t", data)
    assert sorted(
        r[0] for r in con.execute(f"SELECT id FROM t WHERE {sql}", params).fetchall()
    ) == [1, 4, 7]
    assert to_iceberg(expr) is not None  # folded pairwise: pyiceberg recurses over it
    assert can_match(expr, {"region": "y"}, SCHEMA)
