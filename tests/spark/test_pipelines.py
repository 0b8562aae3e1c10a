"""Pipelines on Spark (Kafka -> Iceberg flush, compaction) while readers read: exactly once."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

from clients import HarnessClient
from pipelines.spark_jobs import compact, move
from tests.gateway.helpers import IcebergFixture, versioned_table, write_parquet
from tests.gateway.kafka_helpers import json_values, new_topic, produce

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ARROW = pa.schema([("id", pa.int64()), ("p", pa.int32()), ("payload", pa.string())])


def test_flush_and_compaction_keep_the_union_exact(
    spark,
    gateway,
    client: HarnessClient,
    kafka_bootstrap: str,
    iceberg: IcebergFixture,
    tmp_path: Path,
) -> None:
    server, _ = gateway
    uri = f"grpc://127.0.0.1:{server.port}"
    topic = new_topic(kafka_bootstrap)
    iceberg.create("flushed", ARROW)
    for i in range(5):  # small files to compact
        write_parquet(
            tmp_path / "small" / f"s{i}.parquet",
            pa.table(
                {
                    "id": [100_000 + i * 10 + j for j in range(10)],
                    "p": [9] * 10,
                    "payload": ["f"] * 10,
                },
                schema=ARROW,
            ),
        )
    client.create_table("t", [{"name": f.name, "type": str(f.type)} for f in ARROW])
    client.commit(
        "t",
        add_sources=[
            {
                "name": "k0",
                "kind": "kafka",
                "config": {"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0},
                "state": {"low": 0, "high": 0},
            },
            {
                "name": "cold",
                "kind": "iceberg",
                "config": iceberg.source_config("flushed"),
                "state": {"snapshot_id": None},
            },
            {
                "name": "small",
                "kind": "files",
                "config": {"root": str(tmp_path / "small")},
                "state": {"files": [f"s{i}.parquet" for i in range(5)]},
            },
        ],
    )
    files_ids = {100_000 + i for i in range(50)}
    delivered: dict[int, int] = {}
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: dict[int, list[int]] = {}
    next_id = [0]

    def producer() -> None:
        while not stop.is_set():
            ids = list(range(next_id[0], next_id[0] + 20))
            next_id[0] += 20
            offs = produce(
                kafka_bootstrap,
                topic,
                json_values([{"id": i, "p": 0, "payload": "k"} for i in ids]),
            )
            delivered.update(zip(offs, ids, strict=True))
            with client.lock("t", ["k0"], owner="ingester", ttl_s=30, wait_s=60) as lock:
                low = client.describe("t").source("k0").state["low"]
                client.commit(
                    "t",
                    lock=lock,
                    updates=[{"source": "k0", "state": {"low": low, "high": max(offs) + 1}}],
                )

    def reader() -> None:
        while not stop.is_set():
            v = client.pinned_version(client.flight_info("t"))
            ids = client.read("t", version=v, columns=["id"]).column("id").to_pylist()
            high = client.describe("t", version=v).source("k0").state["high"]
            expected = {i for off, i in list(delivered.items()) if off < high} | files_ids
            assert len(ids) == len(set(ids)), f"duplicates at version {v}"
            assert set(ids) == expected, (
                f"version {v}: missing {sorted(expected - set(ids))[:5]} extra {sorted(set(ids) - expected)[:5]}"
            )
            seen.setdefault(v, sorted(ids))

    def guard(fn):
        def run() -> None:
            try:
                fn()
            except BaseException as e:
                errors.append(e)
                stop.set()

        return run

    threads = [threading.Thread(target=guard(producer)), threading.Thread(target=guard(reader))]
    for t in threads:
        t.start()
    try:

        def flush() -> int:
            return move(spark, uri, client, "t", "k0", "cold").rows

        moved = 0
        for _ in range(3):
            moved += flush()
        before_compaction = client.describe("t").version
        compact(spark, uri, client, "t", "small", files=1)
        compact(spark, uri, client, "t", "cold", files=1)
        moved += flush()
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert moved > 0 and len(seen) >= 3
    small = client.describe("t").source("small").state["files"]
    # One file, written by the compaction job (under its write's "compacted" directory).
    assert len(small) == 1 and "/compacted/" in small[0]
    history = client.history("t")
    assert [
        c.summary.get("relocation") for c in history if c.summary["operation"] == "compaction"
    ] == [True, True]
    for v, ids in list(seen.items())[
        :5
    ]:  # pinned versions (before compaction too) re-read identically
        assert sorted(client.read("t", version=v, columns=["id"]).column("id").to_pylist()) == ids
    # Compaction rewrote files, not rows: the latest version holds the same ids as just before it.
    after = client.describe("t").version
    assert after > before_compaction


def test_spark_postgres_cold_move_while_readers_read(
    spark, gateway, client: HarnessClient, pg_dsn: str, iceberg: IcebergFixture
) -> None:

    import psycopg

    from pipelines.spark_jobs import move

    server, _ = gateway
    uri = f"grpc://127.0.0.1:{server.port}"
    name, as_of = versioned_table(
        pg_dsn,
        "hot",
        "id bigint PRIMARY KEY, p int, payload text",
        "SELECT g, g % 2, 'x' FROM generate_series(0, 199) g",
    )
    iceberg.create("pgcold_spark", ARROW)
    client.create_table(
        "e", [{"name": f.name, "type": str(f.type)} for f in ARROW], primary_key=["id"]
    )
    client.commit(
        "e",
        add_sources=[
            {
                "name": "hot",
                "kind": "postgres",
                "config": {"dsn": pg_dsn, "table": name},
                "state": {"as_of": as_of},
            },
            {
                "name": "cold",
                "kind": "iceberg",
                "config": iceberg.source_config("pgcold_spark"),
                "state": {"snapshot_id": None},
            },
        ],
    )
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = [0]

    def reader() -> None:
        try:
            while not stop.is_set():
                ids = client.read("e", columns=["id"]).column("id").to_pylist()
                assert sorted(ids) == list(range(200)), "exactly once at every version"
                reads[0] += 1
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    try:
        first = move(spark, uri, client, "e", "hot", "cold", where="p = 0")
        second = move(spark, uri, client, "e", "hot", "cold")
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors
    assert (first.rows, second.rows) == (100, 100) and reads[0] > 0
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{name}"').fetchone() == (0,)
    assert iceberg.catalog.load_table("db.pgcold_spark").scan().to_arrow().num_rows == 200


def test_cold_move_command_line_runs_the_cold_move(
    gateway, client: HarnessClient, pg_dsn: str, iceberg: IcebergFixture
) -> None:
    """Regression: ``python -m pipelines.spark_jobs cold-move`` ran compaction instead."""
    import os
    import subprocess
    import sys

    server, _ = gateway
    name, as_of = versioned_table(
        pg_dsn,
        "hot",
        "id bigint PRIMARY KEY, p int, payload text",
        "SELECT g, g % 2, 'x' FROM generate_series(0, 49) g",
    )
    iceberg.create("cli_cold", ARROW)
    client.create_table(
        "e", [{"name": f.name, "type": str(f.type)} for f in ARROW], primary_key=["id"]
    )
    client.add_source(
        "e", "hot", "postgres", config={"dsn": pg_dsn, "table": name}, state={"as_of": as_of}
    )
    client.add_source(
        "e",
        "cold",
        "iceberg",
        config=iceberg.source_config("cli_cold"),
        state={"snapshot_id": None},
    )
    args = [
        "cold-move",
        "--uri",
        f"grpc://127.0.0.1:{server.port}",
        "--table",
        "e",
        "--hot",
        "hot",
        "--cold",
        "cold",
        "--where",
        "p = 1",
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.spark_jobs", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = client.history("e", limit=1)[0].summary
    assert (last["operation"], last["hot"], last["relocation"]) == ("move", "hot", True)
    cold = iceberg.catalog.load_table("db.cli_cold").scan().to_arrow()
    assert sorted(cold.column("id").to_pylist()) == list(range(1, 50, 2))
    assert sorted(client.read("e", columns=["id"]).column("id").to_pylist()) == list(range(50))
