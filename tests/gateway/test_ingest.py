"""Ingest helpers against the real broker and Postgres."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

from clients import HarnessClient
from pipelines.ingest import KafkaIngester, PostgresUpsertWriter
from planners.postgres.versioning import enable_versioning, server_now
from tests.gateway.kafka_helpers import json_values, new_topic, produce

pytestmark = pytest.mark.integration
SCHEMA = [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}]


def test_kafka_ingester_commits_highs_and_position(
    client: HarnessClient, kafka_bootstrap: str
) -> None:
    topic = new_topic(kafka_bootstrap, partitions=2)
    client.create_table("t", SCHEMA)
    client.commit(
        "t",
        add_sources=[
            {
                "name": f"k{p}",
                "kind": "kafka",
                "config": {"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": p},
                "state": {"low": 0, "high": 0},
            }
            for p in (0, 1)
        ],
    )
    produce(
        kafka_bootstrap, topic, json_values([{"id": i, "name": "a"} for i in range(6)]), partition=0
    )
    produce(
        kafka_bootstrap,
        topic,
        json_values([{"id": 100 + i, "name": "b"} for i in range(4)]),
        partition=1,
    )
    ingester = KafkaIngester(
        client, "t", kafka_bootstrap, topic, {0: "k0", 1: "k1"}, group_id="g1", interval_s=0.2
    )
    stop = threading.Event()
    th = threading.Thread(target=ingester.run, args=(stop,))
    th.start()
    try:
        deadline = time.monotonic() + 20
        while client.read("t").num_rows < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.read("t").num_rows == 10
        # New messages show up in a later read without anyone touching the table.
        produce(kafka_bootstrap, topic, json_values([{"id": 6, "name": "late"}]), partition=0)
        while client.read("t").num_rows < 11 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(client.read("t", filter="name = 'late'").column("id").to_pylist()) == [6]
    finally:
        stop.set()
        th.join(30)
    d = client.describe("t")
    assert d.external_state == {f"kafka.g1.{topic}.0": 7, f"kafka.g1.{topic}.1": 4}
    assert {s.name: s.state["high"] for s in d.sources} == {"k0": 7, "k1": 4}
    # A restarted ingester resumes from the committed position: nothing new to commit.
    again = KafkaIngester(client, "t", kafka_bootstrap, topic, {0: "k0", 1: "k1"}, group_id="g1")
    again.poll(1.0)
    assert again.commit() is None
    again.consumer.close()


def test_postgres_upsert_writer(client: HarnessClient, pg_dsn: str) -> None:
    name = f"up_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{name}" (id bigint PRIMARY KEY, name text)')
        enable_versioning(conn, name)
        start = server_now(conn)
    client.create_table("t", SCHEMA, primary_key=["id"])
    client.add_source(
        "t", "pg", "postgres", config={"dsn": pg_dsn, "table": name}, state={"as_of": start}
    )
    w = PostgresUpsertWriter(client, "t", "pg")
    v1 = w.write([{"id": 1, "name": "a"}, {"id": 2, "name": "b"}])
    v2 = w.write([{"id": 2, "name": "B"}, {"id": 3, "name": "c"}])
    w.close()
    assert client.read("t", version=v1).sort_by("id").column("name").to_pylist() == ["a", "b"]
    assert client.read("t", version=v2).sort_by("id").column("name").to_pylist() == ["a", "B", "c"]
