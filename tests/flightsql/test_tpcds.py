"""The 99 TPC-DS queries through a real ADBC Flight SQL client, over the 24 tables dealt across
Parquet files, Iceberg, versioned Postgres, Delta and DuckLake (``benchmarks/tpcds_tables.py``):
every answer equals DuckDB's on the same rows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import pytest

from benchmarks import tpcds_tables as tpcds
from benchmarks import tpch_tables as tpch
from tests.flightsql.test_tpch import assert_same_rows
from tests.gateway.helpers import client_for, running_gateway

pytestmark = pytest.mark.integration

SF = 0.01


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str) -> Iterator[tuple[Any, Any]]:
    root = tmp_path_factory.mktemp("tpcds")
    oracle = tpcds.generate(SF)
    placement = tpcds.placement(oracle)
    assert set().union(*placement.values()) == set(tpcds.KINDS)
    with running_gateway(f"sqlite:///{root / 'catalog.db'}") as (server, _):
        client = client_for(server)
        tpch.load(client, oracle, root, pg_dsn, placement)
        with flightsql.connect(client.uri, autocommit=True) as conn:
            yield conn, oracle
        client.close()
    oracle.close()


@pytest.mark.parametrize("number", range(1, 100))
def test_tpcds_query_equals_duckdb(setup: tuple[Any, Any], number: int) -> None:
    conn, oracle = setup
    sql = dict(tpcds.queries(oracle))[number]
    expected = oracle.execute(sql).fetchall()
    with conn.cursor() as cur:
        cur.execute(sql)
        got = cur.fetchall()
    assert_same_rows(got, expected, ordered="order by" in sql.lower())
