"""Streaming (``since`` reads and ``readStream.format("harness-flight")``) over every write path:
DoPut into each writable kind, Spark append and overwrite, every mover, compaction and a schema
change. Each written row is delivered exactly once; moves, compaction and schema changes deliver
nothing."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clients import HarnessClient
from pipelines.mover import Mover
from pipelines.spark_jobs import compact
from planners.postgres.versioning import enable_versioning, server_now
from tests.gateway.helpers import DuckLakeFixture, IcebergFixture
from tests.gateway.kafka_helpers import new_topic

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])


def _sources(kafka: str, pg_dsn: str, pg: str, as_of: str, ice: dict, lake: dict, root: Path):
    return [
        {
            "name": "k",
            "kind": "kafka",
            "config": {"bootstrap_servers": kafka, "topic": new_topic(kafka), "partition": 0},
            "state": {"low": 0, "high": 0},
        },
        {
            "name": "pg",
            "kind": "postgres",
            "config": {"dsn": pg_dsn, "table": pg},
            "state": {"as_of": as_of},
        },
        {"name": "ice", "kind": "iceberg", "config": ice, "state": {"snapshot_id": None}},
        {"name": "f", "kind": "files", "config": {"root": str(root)}, "state": {"files": []}},
        lake,
    ]


@pytest.fixture
def every_kind(
    client: HarnessClient,
    kafka_bootstrap: str,
    pg_dsn: str,
    iceberg: IcebergFixture,
    ducklake: DuckLakeFixture,
    tmp_path: Path,
) -> None:
    pg = f"stream_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{pg}" (id bigint PRIMARY KEY, v text)')
        enable_versioning(conn, pg)
        as_of = server_now(conn)
    iceberg.create("streamed", ARROW)
    snap = ducklake.execute("CREATE TABLE lake.sink (id BIGINT, v VARCHAR)")
    lake = {
        "name": "lake",
        "kind": "ducklake",
        "config": ducklake.source_config("sink"),
        "state": {"snapshot_id": snap},
    }
    client.create_table(
        "t", [{"name": "id", "type": "int64"}, {"name": "v", "type": "string"}], primary_key=["id"]
    )
    sources = _sources(
        kafka_bootstrap, pg_dsn, pg, as_of, iceberg.source_config("streamed"), lake, tmp_path / "f"
    )
    client.commit("t", add_sources=sources)


def test_every_write_path_streams_each_row_exactly_once(
    spark, gateway, client: HarnessClient, every_kind: None, tmp_path: Path
) -> None:
    server, _ = gateway
    uri = f"grpc://127.0.0.1:{server.port}"
    start = client.describe("t").version
    next_id, last = [0], [start]

    def fresh(n: int) -> list[int]:
        ids = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return ids

    def put(source: str, n: int, **extra: list) -> list[int]:
        ids = fresh(n)
        client.put("t", pa.table({"id": ids, "v": [source] * n, **extra}), source=source)
        return ids

    def spark_write(source: str, n: int, mode: str = "append") -> list[int]:
        ids = fresh(n)
        df = spark.createDataFrame([(i, f"spark-{source}") for i in ids], "id long, v string")
        df.write.format("harness-flight").option("uri", uri).option("table", "t").option(
            "source", source
        ).mode(mode).save()
        return ids

    def moved(run: Callable[[], object]) -> list[int]:
        run()
        return []

    def added_since_last() -> list[int]:
        version = client.describe("t").version
        info = client.flight_info("t", version=version, since=last[0], columns=["id"])
        last[0] = version
        parts = [client.read_endpoint(ep).read_all() for ep in info.endpoints]
        return sorted(i for p in parts for i in p.column("id").to_pylist())

    movers = {
        "k->pg": Mover(client, "t", "k", "pg"),
        "k->ice": Mover(client, "t", "k", "ice"),
        "pg->lake": Mover(client, "t", "pg", "lake"),
        "pg->ice": Mover(client, "t", "pg", "ice"),
    }
    steps: list[tuple[str, Callable[[], list[int]]]] = [
        ("DoPut kafka", lambda: put("k", 10)),
        ("DoPut postgres", lambda: put("pg", 10)),
        ("DoPut iceberg", lambda: put("ice", 10)),
        ("DoPut files", lambda: put("f", 10)),
        ("mover kafka->postgres", lambda: moved(movers["k->pg"].run_once)),
        ("DoPut kafka again", lambda: put("k", 5)),
        ("mover kafka->iceberg", lambda: moved(movers["k->ice"].run_once)),
        ("mover postgres->ducklake", lambda: moved(movers["pg->lake"].run_once)),
        ("DoPut postgres again", lambda: put("pg", 5)),
        ("mover postgres->iceberg", lambda: moved(movers["pg->ice"].run_once)),
        ("Spark append files", lambda: spark_write("f", 10)),
        ("Spark append iceberg", lambda: spark_write("ice", 10)),
        ("Spark overwrite files", lambda: spark_write("f", 7, "overwrite")),
        ("Spark overwrite iceberg", lambda: spark_write("ice", 6, "overwrite")),
        ("compaction iceberg", lambda: moved(lambda: compact(spark, uri, client, "t", "ice"))),
        ("compaction files", lambda: moved(lambda: compact(spark, uri, client, "t", "f"))),
        (
            "schema change",
            lambda: moved(
                lambda: client.evolve_schema(
                    "t", [{"op": "add_column", "name": "extra", "type": "int64"}]
                )
            ),
        ),
        *[
            (f"DoPut {s} with the new column", lambda s=s: put(s, 3, extra=[1, 2, 3]))
            for s in ("k", "pg", "ice", "f")
        ],
    ]
    written: list[int] = []
    for name, step in steps:
        new = step()
        written += new
        assert added_since_last() == sorted(new), f"after {name}"

    # The same through Spark's streaming source, from before the first write, in one query.
    out = tmp_path / "stream-out"
    q = (
        spark.readStream.format("harness-flight")
        .option("uri", uri)
        .option("table", "t")
        .option("columns", "id")
        .option("starting_version", str(start))
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(180)
    assert q.exception() is None
    streamed = [i for f in out.glob("*.parquet") for i in pq.read_table(f).column("id").to_pylist()]
    assert sorted(streamed) == sorted(written) and len(set(written)) == len(written)
