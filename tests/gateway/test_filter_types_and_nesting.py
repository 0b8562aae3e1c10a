"""Through a running gateway: literals of another type than their column (TPC-H Q6 on
decimal(15, 2)) over every pushdown path, and filters nested too deeply or chained very long."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Iterator

import duckdb
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import InvalidArgument
from planners.predicates.parse import MAX_FILTER_DEPTH
from tests.gateway.helpers import (
    DuckLakeFixture,
    IcebergFixture,
    client_for,
    running_gateway,
    write_parquet,
)

pytestmark = pytest.mark.integration

D = decimal.Decimal
ARROW = pa.schema(
    [
        ("id", pa.int64()),
        ("l_quantity", pa.decimal128(15, 2)),
        ("l_discount", pa.decimal128(15, 2)),
        ("l_shipdate", pa.date32()),
        ("n", pa.int32()),
    ]
)
SQL_TYPES = "id BIGINT, l_quantity DECIMAL(15, 2), l_discount DECIMAL(15, 2), l_shipdate DATE, "
SQL_TYPES += "n INTEGER"
ROWS = 80
DATA = pa.table(
    {
        "id": list(range(ROWS)),
        "l_quantity": [D(i % 50) + D("0.50") * (i % 2) for i in range(ROWS)],
        "l_discount": [D(i % 11) / 100 for i in range(ROWS)],
        "l_shipdate": [dt.date(1993, 6, 1) + dt.timedelta(days=15 * i) for i in range(ROWS)],
        "n": [i % 7 for i in range(ROWS)],
    },
    schema=ARROW,
)
Q6 = (
    "l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01' "
    "AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24"
)


@pytest.fixture(scope="module")
def lineitem(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str) -> Iterator[HarnessClient]:
    """A gateway with table ``lineitem`` over four kinds, one quarter of the rows each."""
    root = tmp_path_factory.mktemp("lineitem")
    quarter = ROWS // 4
    files, ice, lake, pg = (DATA.slice(i * quarter, quarter) for i in range(4))
    write_parquet(root / "files" / "a.parquet", files)
    iceberg = IcebergFixture(root / "ice")
    table = iceberg.create("lineitem", ARROW)
    table.append(ice)
    ducklake = DuckLakeFixture(root / "lake")
    with running_gateway(f"sqlite:///{root / 'catalog.db'}") as (server, _):
        client = client_for(server)
        client.create_table("lineitem", [{"name": f.name, "type": str(f.type)} for f in ARROW])
        client.commit(
            "lineitem",
            add_sources=[
                {
                    "name": "files",
                    "kind": "files",
                    "config": {"root": str(root / "files")},
                    "state": {"files": ["a.parquet"]},
                },
                {
                    "name": "ice",
                    "kind": "iceberg",
                    "config": iceberg.source_config("lineitem"),
                    "state": {"snapshot_id": table.current_snapshot().snapshot_id},
                },
                {
                    "name": "lake",
                    "kind": "ducklake",
                    "config": ducklake.source_config("lineitem"),
                    "state": {"snapshot_id": _ducklake(ducklake, lake)},
                },
                {
                    "name": "pg",
                    "kind": "postgres",
                    "config": {"dsn": pg_dsn, "table": "lineitem"},
                    "state": {"as_of": _postgres(pg_dsn, pg)},
                },
            ],
        )
        yield client
        client.close()


def _ducklake(lake: DuckLakeFixture, part: pa.Table) -> int:
    from planners.ducklake import connect

    con = connect(lake.config, read_only=False)
    try:
        con.execute(f"CREATE TABLE lake.lineitem ({SQL_TYPES})")
        con.register("part", part)
        con.execute("INSERT INTO lake.lineitem SELECT * FROM part")
        return int(con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0])
    finally:
        con.close()


def _postgres(dsn: str, part: pa.Table) -> str:
    import psycopg

    from planners.postgres.versioning import enable_versioning, server_now

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS lineitem_history, lineitem")
        conn.execute(f"CREATE TABLE lineitem ({SQL_TYPES})")
        enable_versioning(conn, "lineitem")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO lineitem VALUES (%s, %s, %s, %s, %s)",
                [tuple(r.values()) for r in part.to_pylist()],
            )
        return server_now(conn)


def expected(flt: str) -> list[int]:
    con = duckdb.connect()
    con.register("lineitem", DATA)
    return sorted(r[0] for r in con.execute(f"SELECT id FROM lineitem WHERE {flt}").fetchall())


def read_ids(client: HarnessClient, flt: str) -> list[int]:
    return sorted(client.read("lineitem", columns=["id"], filter=flt).column("id").to_pylist())


@pytest.mark.parametrize(
    "flt",
    [
        Q6,
        "l_quantity < 24",  # an integer literal against decimal(15, 2)
        "l_quantity >= 24.5 AND l_quantity <= 30",
        "l_quantity < 23.999",  # finer than the column's scale: exact, never rounded
        "l_quantity = 24.005",
        "l_quantity IN (1, 2.5, 3.50)",
        "n < 2.5",  # a decimal literal against an integer column means n <= 2
        "n > 2.5 AND n <= 4.0",
        "n = 2.5",
        "NOT (n = 2.5)",
        "n < 3e0",
        # 1993-12-28 is a ship date: truncating the time to the day would keep/drop it.
        "l_shipdate < TIMESTAMP '1993-12-28 12:00:00'",
        "l_shipdate >= TIMESTAMP '1993-12-28 12:00:00'",
    ],
)
def test_mixed_literal_types_through_every_kind(lineitem: HarnessClient, flt: str) -> None:
    want = expected(flt)
    assert read_ids(lineitem, flt) == want
    assert flt != Q6 or want  # Q6 selects rows: the case from the issue is exercised


def test_literal_that_cannot_compare_is_invalid_argument(lineitem: HarnessClient) -> None:
    for flt in ("l_quantity < '24'", "n = 'x'", "l_shipdate = 5", "n = DATE '2024-01-01'"):
        with pytest.raises(InvalidArgument, match="does not fit column"):
            lineitem.read("lineitem", filter=flt)


@pytest.mark.parametrize(
    "flt",
    [
        "(" * 3000 + "n = 1" + ")" * 3000,  # sqlglot's own parser gives up (RecursionError)
        "NOT " * 3000 + "n = 1",
        "NOT " * (MAX_FILTER_DEPTH + 1) + "n = 1",  # parsed, then over the bound
        "n = 1 OR (n = 2 AND (" * 17 + "n = 3" + "))" * 17,
    ],
    ids=["3000-parens", "3000-nots", "bound+1-nots", "alternating-and-or"],
)
def test_deep_nesting_is_invalid_argument(lineitem: HarnessClient, flt: str) -> None:
    with pytest.raises(InvalidArgument, match=f"more than {MAX_FILTER_DEPTH} levels"):
        lineitem.read("lineitem", filter=flt)
    assert read_ids(lineitem, "n = 1") == expected("n = 1")  # and the server keeps serving


def test_deep_nesting_status_on_the_wire(lineitem: HarnessClient) -> None:
    """Any Flight client sees INVALID_ARGUMENT: a chained RecursionError's 1,000-frame traceback
    in the status details once made gRPC answer RESOURCE_EXHAUSTED instead."""
    raw = fl.connect(lineitem.uri)
    for flt in ("(" * 3000 + "n = 1" + ")" * 3000, "NOT " * 3000 + "n = 1"):
        descriptor = fl.FlightDescriptor.for_command(
            json.dumps({"table": "lineitem", "filter": flt})
        )
        with pytest.raises(pa.ArrowInvalid, match="levels deep"):
            raw.get_flight_info(descriptor)
    raw.close()


def test_nesting_up_to_the_bound_works(lineitem: HarnessClient) -> None:
    flt = "NOT " * MAX_FILTER_DEPTH + "n = 1"  # an even count: n = 1
    assert read_ids(lineitem, flt) == expected("n = 1")
    alternating = "n = 1 OR (n = 2 AND (" * 15 + "n = 3" + "))" * 15
    assert read_ids(lineitem, alternating) == expected(alternating)


def test_long_flat_chains_work(lineitem: HarnessClient) -> None:
    """Generated filters chain thousands of terms; sqlglot parses them left-deep."""
    chain = " OR ".join(f"id = {i}" for i in range(0, 15_000, 3))  # 5,000 terms
    chain += " OR " + " OR ".join(f"(n = {i % 7} AND id = {i})" for i in range(1, 400, 3))
    assert len(chain) < 100_000  # MAX_FILTER_CHARS
    want = [i for i in range(ROWS) if i % 3 in (0, 1)]
    assert read_ids(lineitem, chain) == want  # (DuckDB itself takes a minute to plan this)
    conj = " AND ".join(f"id <> {i}" for i in range(1, 5001, 2))
    assert read_ids(lineitem, conj) == [i for i in range(ROWS) if i % 2 == 0]
