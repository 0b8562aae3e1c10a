"""Property: for random data and random filters, gateway result == DuckDB filtering the same rows.

The rows are split over every kind that pushes filters down in its own way: Parquet files
(pyarrow dataset), DuckLake (SQL with ``?``), Iceberg (pyiceberg pruning + residual) and
PostgreSQL (SQL with ``$n``). Literals often have another type than their column (integer vs
decimal, decimal vs float32, timestamp vs date), which must compare exactly as in DuckDB.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import uuid
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.helpers import (
    DuckLakeFixture,
    IcebergFixture,
    client_for,
    running_gateway,
    write_parquet,
)
from tests.planners.filter_strategies import filters

pytestmark = pytest.mark.integration

D = decimal.Decimal
ARROW = pa.schema(
    [
        ("id", pa.int64()),
        ("n", pa.int32()),
        ("s", pa.string()),
        ("x", pa.float64()),
        ("d", pa.date32()),
        ("q", pa.decimal128(15, 2)),
        ("f", pa.float32()),
        ("ts", pa.timestamp("us")),
    ]
)
SCHEMA = [{"name": f.name, "type": str(f.type)} for f in ARROW]
SQL_TYPES = "id BIGINT, n INTEGER, s VARCHAR, x DOUBLE PRECISION, d DATE, q DECIMAL(15, 2), "
SQL_TYPES += "f REAL, ts TIMESTAMP"
COLUMNS = {
    "n": "int",
    "s": "string",
    "x": "float",
    "d": "date",
    "q": "decimal",
    "f": "float",
    "ts": "timestamp",
}

_day = dt.datetime(2024, 1, 2)
values: dict[str, st.SearchStrategy[Any]] = {
    "n": st.integers(-3, 3),
    "s": st.sampled_from(["", "a", "ab", "abc", "b", "ba"]),
    "x": st.sampled_from([-1.5, 0.0, 0.1, 0.5, 2.0]),
    "d": st.dates(dt.date(2024, 1, 1), dt.date(2024, 1, 5)),
    "q": st.sampled_from([D("23.50"), D("24.00"), D("23.99"), D("-1.00"), D("0.00"), D("24.01")]),
    "f": st.sampled_from([-1.5, 0.0, 0.10000000149011612, 0.5, 2.0]),  # float32 values
    "ts": st.sampled_from(
        [
            _day,
            _day.replace(hour=12),
            _day.replace(hour=23, minute=59, second=59, microsecond=999_999),
            _day + dt.timedelta(days=1),
            _day - dt.timedelta(hours=12) + dt.timedelta(microseconds=1),
        ]
    ),
}
row = st.fixed_dictionaries({c: st.none() | v for c, v in values.items()})


class Sources:
    """The data sources behind the gateway, one new table of each per example."""

    def __init__(self, root: Path, pg_dsn: str) -> None:
        self.root, self.pg_dsn = root, pg_dsn
        self.lake = DuckLakeFixture(root / "lake")
        self.iceberg = IcebergFixture(root / "ice")

    def add(self, name: str, parts: list[pa.Table]) -> list[dict[str, Any]]:
        """Put one part of the rows in each kind of source; returns their harness specs."""
        files, lake, ice, pg = parts
        write_parquet(self.root / f"{name}.parquet", files)
        table = self.iceberg.create(name, ARROW)
        if ice.num_rows:
            table.append(ice)
        snapshot = table.current_snapshot()
        return [
            {
                "name": "files",
                "kind": "files",
                "config": {"root": str(self.root)},
                "state": {"files": [f"{name}.parquet"]},
            },
            {
                "name": "lake",
                "kind": "ducklake",
                "config": self.lake.source_config(name),
                "state": {"snapshot_id": self._ducklake(name, lake)},
            },
            {
                "name": "ice",
                "kind": "iceberg",
                "config": self.iceberg.source_config(name),
                "state": {"snapshot_id": snapshot.snapshot_id if snapshot else None},
            },
            {
                "name": "pg",
                "kind": "postgres",
                "config": {"dsn": self.pg_dsn, "table": name},
                "state": {"as_of": self._postgres(name, pg)},
            },
        ]

    def _ducklake(self, name: str, part: pa.Table) -> int:
        from planners.ducklake import connect

        con = connect(self.lake.config, read_only=False)
        try:
            con.execute(f"CREATE TABLE lake.{name} ({SQL_TYPES})")
            if part.num_rows:
                con.register("part", part)
                con.execute(f"INSERT INTO lake.{name} SELECT * FROM part")
            return int(con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0])
        finally:
            con.close()

    def _postgres(self, name: str, part: pa.Table) -> str:
        import psycopg

        from planners.postgres.versioning import enable_versioning, server_now

        with psycopg.connect(self.pg_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE TABLE "{name}" ({SQL_TYPES})')
            enable_versioning(conn, name)
            with conn.cursor() as cur:
                cur.executemany(
                    f'INSERT INTO "{name}" VALUES ({", ".join(["%s"] * len(ARROW))})',
                    [tuple(r.values()) for r in part.to_pylist()],
                )
            return server_now(conn)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str):
    root = tmp_path_factory.mktemp("prop")
    with running_gateway(f"sqlite:///{root / 'catalog.db'}") as (server, _):
        client = client_for(server)
        yield client, Sources(root, pg_dsn)
        client.close()


@pytest.mark.slow
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    data=st.lists(row, min_size=0, max_size=24),
    flts=st.lists(filters(COLUMNS), min_size=1, max_size=12),
    cuts=st.lists(st.integers(0, 24), min_size=3, max_size=3).map(sorted),
)
def test_gateway_filter_equals_duckdb(
    env, data: list[dict], flts: list[str], cuts: list[int]
) -> None:
    client, sources = env
    name = f"t{uuid.uuid4().hex[:10]}"
    table = pa.Table.from_pylist([{"id": i, **r} for i, r in enumerate(data)], schema=ARROW)
    bounds = [0, *(min(c, table.num_rows) for c in cuts), table.num_rows]
    parts = [table.slice(a, b - a) for a, b in itertools.pairwise(bounds)]
    client.create_table(name, SCHEMA)
    client.commit(name, add_sources=sources.add(name, parts))
    con = duckdb.connect()
    con.register("data", table)
    for flt in flts:  # set-up is the costly part: check many filters per data set
        got = sorted(client.read(name, columns=["id"], filter=flt).column("id").to_pylist())
        want = sorted(r[0] for r in con.execute(f"SELECT id FROM data WHERE {flt}").fetchall())
        assert got == want, flt
