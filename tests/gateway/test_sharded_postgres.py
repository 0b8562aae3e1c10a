"""Sharded Postgres: one source per shard, each shard its own server (standing in for a Citus
shard placement), rows routed by partition, ``as_of`` pinned per shard, and one mover per
shard running at once with no conflicts and no retries."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import InvalidArgument
from pipelines.mover import Mover
from planners.postgres.versioning import enable_versioning, server_now
from tests.gateway.kafka_helpers import json_values, new_topic, produce

pytestmark = [pytest.mark.integration]
ARROW = pa.schema(
    [("p", pa.int32()), ("id", pa.int64()), ("msg", pa.string()), ("rev", pa.int64())]
)
SCHEMA = [{"name": f.name, "type": str(f.type)} for f in ARROW]


def shard_rows(dsn: str, table: str) -> list[tuple[int, int]]:
    with psycopg.connect(dsn) as conn:
        return sorted(conn.execute(f'SELECT p, id FROM "{table}"').fetchall())


def sharded_table(client: HarnessClient, shards: list[str], name: str, topic: str | None,
                  bootstrap: str | None = None) -> None:  # fmt: skip
    """Table ``name`` partitioned by ``p``: shard ``i`` holds partition ``p = i`` on server ``i``
    (and Kafka partition ``i`` of ``topic`` when given)."""
    sources: list[dict[str, Any]] = []
    for p, dsn in enumerate(shards):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP TABLE IF EXISTS "{name}" CASCADE')
            conn.execute(
                f'CREATE TABLE "{name}" (p int, id bigint, msg text, rev bigint, PRIMARY KEY (p, id))'
            )
            enable_versioning(conn, name)
            sources.append(
                {
                    "name": f"shard-{p}",
                    "kind": "postgres",
                    "partition": {"p": p},
                    "config": {"dsn": dsn, "table": name},
                    "state": {"as_of": server_now(conn)},
                }
            )
        if topic is not None:
            sources.append(
                {
                    "name": f"kafka-{p}",
                    "kind": "kafka",
                    "partition": {"p": p},
                    "config": {"bootstrap_servers": bootstrap, "topic": topic, "partition": p},
                    "state": {"low": 0, "high": 0},
                }
            )
    client.create_table(
        name, SCHEMA, partition_by=["p"], primary_key=["p", "id"],
        properties={"dedupe.order_by": "rev"},
    )  # fmt: skip
    client.commit(name, add_sources=sources)


def test_doput_routes_each_row_to_its_shard_server(
    client: HarnessClient, pg_shards: list[str]
) -> None:
    sharded_table(client, pg_shards, "routed", None)
    rows = [{"p": i % 3, "id": i, "msg": f"m{i}", "rev": i} for i in range(30)]
    before = client.describe("routed").version
    client.put("routed", pa.Table.from_pylist(rows, schema=ARROW))
    after = client.describe("routed")
    assert after.version == before + 1  # three servers, one harness commit
    for p, dsn in enumerate(pg_shards):
        assert shard_rows(dsn, "routed") == [(p, i) for i in range(30) if i % 3 == p]
    pinned = after.version
    got = client.read("routed", version=pinned, columns=["p", "id"])
    assert sorted(
        zip(got.column("p").to_pylist(), got.column("id").to_pylist(), strict=True)
    ) == sorted((r["p"], r["id"]) for r in rows)
    # Each shard is pinned by its own server's clock: a write made on one shard outside the
    # harness is invisible at the pinned version, and other shards are untouched.
    with psycopg.connect(pg_shards[1], autocommit=True) as conn:
        conn.execute("INSERT INTO routed VALUES (1, 1000, 'late', 1000)")
        conn.execute("UPDATE routed SET msg = 'changed' WHERE id = 1")
    again = client.read("routed", version=pinned, columns=["id", "msg"]).to_pylist()
    assert {r["id"]: r["msg"] for r in again} == {r["id"]: r["msg"] for r in rows}
    # A row for a shard that does not exist is refused, and nothing of the batch is written.
    stray = pa.Table.from_pylist(
        [{"p": 0, "id": 500, "msg": "ok", "rev": 1}, {"p": 7, "id": 501, "msg": "no", "rev": 1}],
        schema=ARROW,
    )
    with pytest.raises(InvalidArgument, match="partition"):
        client.put("routed", stray)
    assert client.describe("routed").version == pinned
    assert (0, 500) not in shard_rows(pg_shards[0], "routed")
    # Filters on the partition column prune whole shards (one task per remaining shard).
    info = client.flight_info("routed", version=pinned, filter="p = 2")
    assert len(info.endpoints) == 1


def test_one_mover_per_shard_runs_concurrently_exactly_once(
    client: HarnessClient, pg_shards: list[str], kafka_bootstrap: str
) -> None:
    shards = len(pg_shards)
    topic = new_topic(kafka_bootstrap, partitions=shards)
    sharded_table(client, pg_shards, "moved", topic, kafka_bootstrap)
    per_shard = 120
    for p in range(shards):
        values = [{"p": p, "id": i, "msg": f"m{i}", "rev": i} for i in range(per_shard)]
        produce(kafka_bootstrap, topic, json_values(values), partition=p)
    client.commit(
        "moved",
        updates=[
            {"source": f"kafka-{p}", "state": {"low": 0, "high": per_shard}} for p in range(shards)
        ],
    )
    versions: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def mover(p: int) -> None:
        try:
            m = Mover(client, "moved", f"kafka-{p}", f"shard-{p}", wait_s=5)  # fmt: skip
            result = m.run_once()
            assert result.version is not None and result.rows == per_shard
            assert m.run_once().version is None  # idempotent: nothing left
        except BaseException as e:  # a conflict or a lock wait would land here
            errors.append(e)

    def reader() -> None:
        try:
            while not stop.is_set():
                info = client.flight_info("moved", columns=["p", "id"])
                version = client.pinned_version(info)
                data = client.read("moved", version=version, columns=["p", "id"])
                keys = list(
                    zip(data.column("p").to_pylist(), data.column("id").to_pylist(), strict=True)
                )
                # Each row exactly once at every version: in Kafka or in its shard, never both.
                assert len(keys) == len(set(keys)) == shards * per_shard, version
                versions.append(version)
        except BaseException as e:
            errors.append(e)

    readers = [threading.Thread(target=reader)]
    movers = [threading.Thread(target=mover, args=(p,)) for p in range(shards)]
    for t in readers + movers:
        t.start()
    for t in movers:
        t.join(180)
    stop.set()
    for t in readers:
        t.join(60)
    assert not errors, errors
    final = client.describe("moved")
    assert {s.name: s.state for s in final.sources if s.kind == "kafka"} == {
        f"kafka-{p}": {"low": per_shard, "high": per_shard} for p in range(shards)
    }
    for p, dsn in enumerate(pg_shards):
        assert shard_rows(dsn, "moved") == [(p, i) for i in range(per_shard)]
    history = client.history("moved")
    moves = [h for h in history if h.summary.get("operation") == "move"]
    intents = [h for h in history if h.summary.get("operation") == "move-intent"]
    # One commit per shard's move (and one for its intent), none retried.
    assert len(moves) == len(intents) == shards
    assert versions  # the reader ran while movers committed
