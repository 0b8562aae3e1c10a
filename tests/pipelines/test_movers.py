"""Movers killed at every step and restarted: no duplicate, nothing lost, at every version."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from clients import HarnessClient
from pipelines.movers import KafkaToIcebergMover, KafkaToPostgresMover, PostgresToIcebergMover
from tests.gateway.helpers import IcebergFixture, versioned_table
from tests.gateway.kafka_helpers import json_values, new_topic, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
ARROW = pa.schema([("id", pa.int64()), ("name", pa.string())])
SCHEMA = [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}]


def run_worker(gateway, kind: str, table: str, hot: str, cold: str, crash_at: str | None) -> int:
    server, _ = gateway
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if crash_at:
        env["HARNESS_FAULT_INJECT"] = crash_at
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "pipelines" / "mover_worker.py"),
            f"grpc://127.0.0.1:{server.port}",
            kind,
            table,
            hot,
            cold,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode in (0, 17), out.stderr[-2000:]
    return out.returncode


def ids_at(client: HarnessClient, table: str, version: int | None = None) -> list[int]:
    return sorted(client.read(table, version=version, columns=["id"]).column("id").to_pylist())


@pytest.mark.parametrize(
    "crash_at",
    [
        None,
        "kafka_iceberg.before_read",
        "kafka_iceberg.before_append",
        "kafka_iceberg.after_append",
        "kafka_iceberg.after_commit",
    ],
)
def test_kafka_to_iceberg_mover_survives_kills(
    gateway,
    client: HarnessClient,
    kafka_bootstrap: str,
    iceberg: IcebergFixture,
    crash_at: str | None,
) -> None:
    topic = new_topic(kafka_bootstrap)
    iceberg.create("cold", ARROW)
    client.create_table("t", SCHEMA)
    cfg = {"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0}
    produce(kafka_bootstrap, topic, json_values([{"id": i, "name": f"n{i}"} for i in range(30)]))
    client.commit(
        "t",
        add_sources=[
            {"name": "k0", "kind": "kafka", "config": cfg, "state": {"low": 0, "high": 20}},
            {
                "name": "cold",
                "kind": "iceberg",
                "config": iceberg.source_config("cold"),
                "state": {"snapshot_id": None},
            },
        ],
    )
    assert run_worker(gateway, "kafka-iceberg", "t", "k0", "cold", crash_at) == (
        17 if crash_at else 0
    )
    assert ids_at(client, "t") == list(range(20))  # in the crash window too
    # More data arrives meanwhile (an ingester waits for the dead mover's lease to end).
    with client.lock("t", ["k0"], owner="ingester", ttl_s=10, wait_s=30) as lock:
        low = client.describe("t").sources[0].state["low"]
        client.commit("t", lock=lock, updates=[{"source": "k0", "state": {"low": low, "high": 30}}])
    mover = KafkaToIcebergMover(client, "t", "k0", "cold", owner="restart", wait_s=30)
    result = mover.run_once()
    assert ids_at(client, "t") == list(range(30))
    state = {s.name: s.state for s in client.describe("t").sources}
    assert state["k0"] == {"low": 30, "high": 30}
    if crash_at == "kafka_iceberg.after_append":
        assert len(result.adopted) == 1  # the orphaned append was committed, not redone
    assert (
        iceberg.catalog.load_table("db.cold").scan().to_arrow().num_rows == 30
    )  # no duplicate file
    assert mover.run_once().version is None  # nothing left: idempotent


@pytest.mark.parametrize(
    "crash_at",
    [
        None,
        "postgres_iceberg.before_append",
        "postgres_iceberg.after_append",
        "postgres_iceberg.after_delete",
        "postgres_iceberg.after_commit",
    ],
)
def test_postgres_to_iceberg_mover_survives_kills(
    gateway, client: HarnessClient, pg_dsn: str, iceberg: IcebergFixture, crash_at: str | None
) -> None:
    name, as_of = versioned_table(
        pg_dsn,
        "hot",
        "id bigint PRIMARY KEY, name text",
        "SELECT g, 'n' || g FROM generate_series(0, 19) g",
    )
    iceberg.create("pgcold", ARROW)
    client.create_table("t", SCHEMA, primary_key=["id"])
    client.commit(
        "t",
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
                "config": iceberg.source_config("pgcold"),
                "state": {"snapshot_id": None},
            },
        ],
    )
    assert run_worker(gateway, "postgres-iceberg", "t", "hot", "cold", crash_at) == (
        17 if crash_at else 0
    )
    assert ids_at(client, "t") == list(range(20))
    PostgresToIcebergMover(client, "t", "hot", "cold", owner="restart", wait_s=30).run_once()
    assert ids_at(client, "t") == list(range(20))
    assert iceberg.catalog.load_table("db.pgcold").scan().to_arrow().num_rows == 20
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{name}"').fetchone() == (0,)


@pytest.mark.parametrize(
    "crash_at",
    [
        None,
        "kafka_postgres.before_upsert",
        "kafka_postgres.after_upsert",
        "kafka_postgres.after_commit",
    ],
)
def test_kafka_to_postgres_mover_survives_kills(
    gateway, client: HarnessClient, kafka_bootstrap: str, pg_dsn: str, crash_at: str | None
) -> None:
    topic = new_topic(kafka_bootstrap)
    name, as_of = versioned_table(pg_dsn, "up", "id bigint PRIMARY KEY, name text")
    # Updates by key: id 3 appears twice; the later offset wins.
    produce(
        kafka_bootstrap,
        topic,
        json_values(
            [{"id": i, "name": f"n{i}"} for i in range(10)] + [{"id": 3, "name": "updated"}]
        ),
    )
    client.create_table("t", SCHEMA, primary_key=["id"])
    client.commit(
        "t",
        add_sources=[
            {
                "name": "k0",
                "kind": "kafka",
                "config": {"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0},
                "state": {"low": 0, "high": 11},
            },
            {
                "name": "pg",
                "kind": "postgres",
                "config": {"dsn": pg_dsn, "table": name},
                "state": {"as_of": as_of},
            },
        ],
    )
    assert run_worker(gateway, "kafka-postgres", "t", "k0", "pg", crash_at) == (
        17 if crash_at else 0
    )
    committed = crash_at in (None, "kafka_postgres.after_commit")
    # Before the commit Kafka still holds all 11 messages; after it Postgres holds 10 keys.
    assert len(ids_at(client, "t")) == (10 if committed else 11)
    KafkaToPostgresMover(client, "t", "k0", "pg", owner="restart", wait_s=30).run_once()
    final = client.read("t").sort_by("id").to_pylist()
    assert [r["id"] for r in final] == list(range(10))
    assert next(r["name"] for r in final if r["id"] == 3) == "updated"


@pytest.mark.parametrize(
    "crash_at",
    [
        None,
        "postgres_ducklake.before_lake",
        "postgres_ducklake.after_lake",
        "postgres_ducklake.after_delete",
        "postgres_ducklake.after_commit",
    ],
)
def test_postgres_to_ducklake_mover_survives_kills(
    gateway, client: HarnessClient, pg_dsn: str, ducklake, crash_at: str | None
) -> None:
    from pipelines.movers import PostgresToDuckLakeMover

    name, as_of = versioned_table(
        pg_dsn,
        "hot",
        "id bigint PRIMARY KEY, name text",
        "SELECT g, 'n' || g FROM generate_series(0, 19) g",
    )
    snap = ducklake.execute("CREATE TABLE lake.cold (id BIGINT, name VARCHAR)")
    client.create_table("t", SCHEMA, primary_key=["id"])
    client.commit(
        "t",
        add_sources=[
            {
                "name": "hot",
                "kind": "postgres",
                "config": {"dsn": pg_dsn, "table": name},
                "state": {"as_of": as_of},
            },
            {
                "name": "lake",
                "kind": "ducklake",
                "config": ducklake.source_config("cold"),
                "state": {"snapshot_id": snap},
            },
        ],
    )
    assert run_worker(gateway, "postgres-ducklake", "t", "hot", "lake", crash_at) == (
        17 if crash_at else 0
    )
    assert ids_at(client, "t") == list(range(20))
    PostgresToDuckLakeMover(client, "t", "hot", "lake", owner="restart", wait_s=30).run_once()
    assert ids_at(client, "t") == list(range(20))
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{name}"').fetchone() == (0,)
    from planners.ducklake import connect

    con = connect(ducklake.source_config("cold"))
    try:  # the repeated lake write replaced rows by key instead of duplicating them
        assert con.execute(
            "SELECT count(*), count(DISTINCT id) FROM lake.main.cold"
        ).fetchone() == (20, 20)
    finally:
        con.close()
