"""Predicate translations: pruning, SQL generation with hostile input."""

from __future__ import annotations

import datetime as dt

import duckdb
import pyarrow as pa
import pytest

from flight_gateway.errors import InvalidArgument
from planners.predicates import can_match, parse_filter, to_sql

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
        "id = 9223372036854775808",
        "day = DATE 'not-a-date'",
        "id = 1.5",
        "region LIKE 'a_b%'",
        "region = id",
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
