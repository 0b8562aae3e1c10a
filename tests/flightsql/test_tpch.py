"""The 22 TPC-H queries through a real ADBC Flight SQL client, over tables spread across Parquet
files, Iceberg, versioned Postgres, Delta and DuckLake (``tests/flightsql/tpch.py``): every
answer equals DuckDB's on the same rows, and the plan shows which sources DuckDB scanned
itself."""

from __future__ import annotations

import decimal
import json
import logging
import math
from collections.abc import Iterator
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import pytest

from benchmarks import tpch_tables as tpch
from tests.gateway.helpers import client_for, running_gateway

pytestmark = pytest.mark.integration

SF = 0.01


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str) -> Iterator[tuple[Any, Any, Any]]:
    root = tmp_path_factory.mktemp("tpch")
    oracle = tpch.generate(SF)
    # No result is kept: every statement here is planned and run (the plan test reads logs).
    no_results = {"sql_result_cache_mb": 0}
    with running_gateway(f"sqlite:///{root / 'catalog.db'}", limits=no_results) as (server, _):
        client = client_for(server)
        tpch.load(client, oracle, root, pg_dsn)
        yield client, oracle, server
        client.close()
    oracle.close()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, decimal.Decimal) or isinstance(b, decimal.Decimal):
        return decimal.Decimal(a) == decimal.Decimal(b)
    return bool(a == b)


def assert_same_rows(got: list[tuple], expected: list[tuple], ordered: bool) -> None:
    assert len(got) == len(expected)
    if not ordered:
        got, expected = sorted(got, key=repr), sorted(expected, key=repr)
    for g, e in zip(got, expected, strict=True):
        assert len(g) == len(e) and all(_same(x, y) for x, y in zip(g, e, strict=True)), (g, e)


@pytest.mark.parametrize("number", range(1, 23))
def test_tpch_query_equals_duckdb(setup: tuple[Any, Any, Any], number: int) -> None:
    client, oracle, _ = setup
    sql = dict(tpch.queries(oracle))[number]
    expected = oracle.execute(sql).fetchall()
    with flightsql.connect(client.uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql)
        got = cur.fetchall()
    assert_same_rows(got, expected, ordered="order by" in sql.lower())


def test_sources_are_scanned_by_duckdb_and_named_tables_planned_once(
    setup: tuple[Any, Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Q21 names lineitem three times and Q7 names nation twice: each is planned once; the
    file-based and Postgres sources are scanned by DuckDB, DuckLake through the stream (or,
    read before at that version, from slices)."""
    client, oracle, _ = setup
    caplog.set_level(logging.INFO, logger="flight_gateway.faces.flightsql.service")
    statements = dict(tpch.queries(oracle))
    with flightsql.connect(client.uri, autocommit=True) as conn, conn.cursor() as cur:
        for n in (21, 7):
            cur.execute(statements[n])
            cur.fetchall()
    plans = [
        json.loads(r.message[len("flight sql: ") :])
        for r in caplog.records
        if r.message.startswith("flight sql: ")
    ]
    q21, q7 = plans[-2], plans[-1]
    assert sorted(q21) == ["lineitem", "nation", "orders", "supplier"]
    scans = {s["name"]: s["scan"] for s in q21["lineitem"]["sources"]}
    # Postgres is scanned on its server the first time a version is read with these columns,
    # and from its Parquet slices once a statement read it before (the queries above may have).
    hot = scans.pop("postgres")
    assert hot in ("PostgresScan", "ParquetScan")
    assert scans == {"files": "ParquetScan", "iceberg": "ParquetScan", "delta": "ParquetScan"}
    assert [s["scan"] for s in q7["nation"]["sources"]] in (["stream"], ["ParquetScan"])


def test_every_statement_reads_its_file_relations_as_ctes(setup: tuple[Any, Any, Any]) -> None:
    """Each statement gets its relations over files as CTEs, not views made before it (a
    view reads every footer twice), also after a comment, as tools often send them."""
    from flight_gateway.core.auth import Principal

    _, oracle, server = setup
    who = Principal("anonymous", read=("*",))
    for n, sql in tpch.queries(oracle):
        for text in (sql, f"-- TPC-H Q{n}\n{sql}"):
            plan = server.sql.engine_plan(text, who)
            assert "AS NOT MATERIALIZED (" in plan.sql, text
            views = [s["sql"] for s in plan.steps if s["sql"].startswith("CREATE TEMP VIEW ")]
            assert all("postgres_query" in v or "__pg_" in v for v in views), (n, views)
