"""A statement's file and stream relations reach DuckDB as common table expressions of the
statement (``engine.with_relations``), not as views made before it: whatever the statement's
own shape (its own CTEs, recursive ones, set operations in parentheses), DuckDB answers exactly
as over views, and through a real gateway exactly as DuckDB over the same file."""

from __future__ import annotations

from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
import duckdb
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from flight_gateway.faces.flightsql.engine import with_relations, without_relations
from flight_gateway.faces.flightsql.workers import Plan
from flight_gateway.protocol.flightsql import pack, pb
from tests.gateway.helpers import client_for, running_gateway

BODY = "SELECT i, i % 3 AS g FROM range(10) t(i)"
STATEMENTS = [
    "SELECT g, count(*) AS n FROM __harness_0 AS t GROUP BY g ORDER BY g",
    "WITH a AS (SELECT i FROM __harness_0 WHERE g = 1) SELECT sum(i) AS s FROM a",
    "WITH RECURSIVE r(n) AS (SELECT min(i) FROM __harness_0 UNION ALL "
    "SELECT n + 1 FROM r WHERE n < (SELECT max(i) FROM __harness_0)) SELECT count(*) FROM r",
    "(SELECT i FROM __harness_0 WHERE g = 0) UNION ALL (SELECT i FROM __harness_0 WHERE g = 2) "
    "ORDER BY i",
    "SELECT count(*) FROM __harness_0 AS a, __harness_0 AS b WHERE a.g = b.g",
    # Any case, after whitespace and comments, as people write them.
    "select max(i) from __harness_0",
    "/* a comment */ SELECT max(i) FROM __harness_0",
    "-- a line comment\n  with a as (select i from __harness_0) select count(*) from a",
    "\n\tWith /* c */ Recursive r(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM r "
    "WHERE n < (SELECT max(i) FROM __harness_0)) SELECT count(*) FROM r",
    "SELECT*FROM __harness_0 ORDER BY i",
]
# Start with neither WITH, SELECT nor a parenthesis after whitespace and comments: views are
# made instead (DuckDB's FROM first; a nested comment ends the comments early).
VIEWS = [
    "FROM __harness_0 SELECT max(i)",
    "/* outer /* nested */ still a comment */ SELECT max(i) FROM __harness_0",
]


@pytest.mark.parametrize("sql", STATEMENTS + VIEWS)
def test_relations_as_ctes_answer_as_views_do(sql: str) -> None:
    views = duckdb.connect()
    views.execute(f"CREATE TEMP VIEW __harness_0 AS {BODY}")
    expected = views.execute(sql).fetchall()

    plan = Plan(sql)
    with_relations(plan, [("__harness_0", BODY)])
    con = duckdb.connect()
    for step in plan.steps:
        con.execute(step["sql"])
    assert con.execute(plan.sql).fetchall() == expected
    if sql in VIEWS:
        assert plan.sql == sql and plan.steps
    else:
        assert not plan.steps and "NOT MATERIALIZED" in plan.sql


def test_an_error_shows_an_excerpt_of_the_callers_statement_alone() -> None:
    statement = "SELECT CAST('x' || i AS INTEGER) FROM __harness_0"
    head = "Conversion Error: Could not convert string 'x0' to INT32"
    caret = "\n" + " " * 40 + "^"
    # A bare piece of a pinned file's path, as DuckDB cuts an excerpt of a long line.
    of_a_path = f"{head}\n\nLINE 1: .../data/part-0.parquet'])),  SELECT CAST('x' || i AS...{caret}"
    assert without_relations(of_a_path, statement) == head
    own = f"{head}\n\nLINE 1: ...CAST('x' || i AS INTEGER) FROM __harness_0{caret}"
    assert without_relations(own, statement) == own
    # Without the statement, only the relations' own words give them away.
    assert without_relations(of_a_path) == of_a_path
    assert without_relations(f"{head}\n\nLINE 1: ...read_parquet(['/d/p'])...") == head


@pytest.mark.integration
def test_statements_of_every_shape_over_a_gateway_match_duckdb(tmp_path: Path) -> None:
    path = tmp_path / "data" / "t.parquet"
    path.parent.mkdir()
    duckdb.connect().execute(f"COPY ({BODY}) TO '{path}'")
    oracle = duckdb.connect()
    oracle.execute(f"CREATE VIEW t AS SELECT * FROM '{path}'")
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}") as (server, _):
        client = client_for(server)
        client.create_table("t", [{"name": "i", "type": "int64"}, {"name": "g", "type": "int64"}])
        client.add_source(
            "t", "f", "files", config={"root": str(path.parent)}, state={"files": [path.name]}
        )
        with flightsql.connect(client.uri, autocommit=True) as conn, conn.cursor() as cur:
            for sql in STATEMENTS:
                user_sql = sql.replace("__harness_0", "t")
                cur.execute(user_sql)
                got = [tuple(r) for r in cur.fetchall()]
                assert got == oracle.execute(user_sql).fetchall(), user_sql
        # An error near the start shows no relation's text (the files, how they are read).
        raw = fl.FlightClient(client.uri)
        bad = "SELECT CAST('x' || i AS INTEGER) FROM t"  # typed fine, fails as it runs
        info = raw.get_flight_info(
            fl.FlightDescriptor.for_command(pack(pb.CommandStatementQuery(query=bad)))
        )
        with pytest.raises(pa.ArrowInvalid) as caught:  # INVALID_ARGUMENT
            raw.do_get(info.endpoints[0].ticket).read_all()
        message = str(caught.value)
        assert "Could not convert" in message and path.name not in message
        assert "union_by_name" not in message and "NOT MATERIALIZED" not in message
        client.close()
