"""The harness-flight DataSource in local Spark against a real gateway."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest

from clients import HarnessClient
from tests.gateway.helpers import IcebergFixture, write_parquet

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ARROW = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("amount", pa.float64()),
    ]
)


def data(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    base = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    return pa.table(
        {
            "id": ids,
            "name": [f"n{i}" for i in ids],
            "ts": [base + dt.timedelta(minutes=i) for i in ids],
            "amount": [i * 0.5 for i in ids],
        },
        schema=ARROW,
    )


@pytest.fixture
def table(gateway, client: HarnessClient, tmp_path: Path, iceberg: IcebergFixture) -> dict:
    server, _ = gateway
    for i in range(3):
        write_parquet(tmp_path / "files" / f"p{i}.parquet", data(i * 100, 100))
    ice = iceberg.create("spark", ARROW)
    ice.append(data(1000, 50))
    client.create_table("t", [{"name": f.name, "type": str(f.type)} for f in ARROW])
    client.commit(
        "t",
        add_sources=[
            {
                "name": "files",
                "kind": "files",
                "config": {"root": str(tmp_path / "files"), "target_task_bytes": 1},
                "state": {"files": ["p0.parquet", "p1.parquet", "p2.parquet"]},
            },
            {
                "name": "ice",
                "kind": "iceberg",
                "config": iceberg.source_config("spark"),
                "state": {"snapshot_id": ice.current_snapshot().snapshot_id},
            },
        ],
    )
    return {"uri": f"grpc://127.0.0.1:{server.port}", "server": server}


def reader(spark, uri: str, **options: str):
    r = spark.read.format("harness-flight").option("uri", uri).option("table", "t")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_read_equals_client_and_partitions_equal_endpoints(
    spark, client: HarnessClient, table: dict
) -> None:
    version = client.describe("t").version
    df = reader(spark, table["uri"], version=str(version))
    assert df.schema.simpleString() == "struct<id:bigint,name:string,ts:timestamp,amount:double>"
    assert df.rdd.getNumPartitions() == len(client.flight_info("t", version=version).endpoints) == 4
    got = sorted((r.id, r.name, r.amount) for r in df.collect())
    want = sorted(
        (r["id"], r["name"], r["amount"]) for r in client.read("t", version=version).to_pylist()
    )
    assert got == want and len(got) == 350


def test_filter_option_is_pushed_and_exact(spark, client: HarnessClient, table: dict) -> None:
    seen = []
    real = table["server"].reads.plan
    table["server"].reads.plan = lambda req, *who: (seen.append(req), real(req, *who))[1]
    try:
        df = reader(spark, table["uri"], filter="id >= 95 AND id < 1003", columns="id,amount")
        rows = sorted(r.id for r in df.collect())
    finally:
        table["server"].reads.plan = real
    assert rows == [*range(95, 300), 1000, 1001, 1002]
    assert (
        seen
        and seen[-1].filter == "(id >= 95 AND id < 1003)"
        and seen[-1].columns == ("id", "amount")
    )


def test_reuse_scenario_is_correct_by_default(spark, table: dict) -> None:
    df = reader(spark, table["uri"])
    assert df.filter("id > 289").count() == 60
    assert df.count() == 350  # the same DataFrame, unfiltered: every row
    df.createOrReplaceTempView("t_view")
    assert spark.sql("SELECT count(*) AS n FROM t_view WHERE id > 1045").first().n == 4
    assert spark.sql("SELECT count(*) AS n FROM t_view").first().n == 350


def test_spark_4_3_reuse_bug_with_pushdown_enabled(spark, table: dict) -> None:
    """Documents the pyspark 4.3.0 behaviour behind the pushdown=false default. If this starts
    failing, Spark scopes the read info per scan again and the default can flip."""
    df = reader(spark, table["uri"], pushdown="true")
    assert df.filter("id > 289").count() == 60
    assert df.count() == 60  # wrong: the filtered plan was reused (should be 350)


def test_sql_temporary_view(spark, table: dict) -> None:
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW harness_t USING `harness-flight` OPTIONS (uri '{table['uri']}', table 't')"
    )
    row = spark.sql(
        "SELECT count(*) AS n, max(id) AS m FROM harness_t WHERE name LIKE 'n1%'"
    ).first()
    assert (row.n, row.m) == (161, 1049)  # n1, n10-n19, n100-n199, n1000-n1049


def test_uri_lists_replicas_and_a_dead_one_is_passed_over(spark, tmp_path: Path) -> None:
    """``uri`` names several gateways on one catalog: planning and every task's DoGet go to a
    live one (in local mode Spark does not retry a failed task, so the source must)."""
    from tests.gateway.helpers import running_gateway, write_parquet

    write_parquet(tmp_path / "f" / "a.parquet", data(0, 500))
    url = f"sqlite:///{tmp_path / 'replicas.db'}"
    with running_gateway(url) as (live, _):
        c = HarnessClient(f"grpc://127.0.0.1:{live.port}")
        c.create_table("r", [{"name": f.name, "type": str(f.type)} for f in data(0, 1).schema])
        c.add_source(
            "r", "f", "files", config={"root": str(tmp_path / "f")}, state={"files": ["a.parquet"]}
        )
        with running_gateway(url) as (doomed, _):
            dead = f"grpc://127.0.0.1:{doomed.port}"
        df = (
            spark.read.format("harness-flight")
            .option("uri", f"{dead},grpc://127.0.0.1:{live.port}")
            .option("table", "r")
            .load()
        )
        got = sorted(r["id"] for r in df.select("id").collect())
        c.close()
    assert got == list(range(500))
