"""Paimon tables written by pypaimon outside the harness: a primary-key table read merged at
pinned snapshots next to a Kafka partition, partition pruning inside Paimon, and refusals."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pypaimon import CatalogFactory, Schema

from clients import HarnessClient
from flight_gateway.protocol.errors import InvalidArgument
from tests.gateway.kafka_helpers import new_topic, produce

pytestmark = pytest.mark.integration

SCHEMA = pa.schema(
    [pa.field("id", pa.int64(), nullable=False), ("region", pa.string()), ("amount", pa.float64())]
)


def _write(table, rows: list[dict]) -> int:
    builder = table.new_batch_write_builder()
    write, commit = builder.new_write(), builder.new_commit()
    write.write_arrow(pa.Table.from_pylist(rows, schema=SCHEMA))
    commit.commit(write.prepare_commit())
    write.close()
    commit.close()
    return table.snapshot_manager().get_latest_snapshot().id


@pytest.fixture
def pk_table(tmp_path):
    catalog = CatalogFactory.create({"warehouse": str(tmp_path / "wh")})
    catalog.create_database("db", True)
    schema = Schema.from_pyarrow_schema(
        SCHEMA, partition_keys=["region"], primary_keys=["region", "id"], options={"bucket": "2"}
    )
    catalog.create_table("db.orders", schema, False)
    return str(tmp_path / "wh"), catalog.get_table("db.orders")


def _rows(ids: range, region: str, scale: float = 1.0) -> list[dict]:
    return [{"id": i, "region": region, "amount": i * scale} for i in ids]


def test_primary_key_table_merged_at_pinned_snapshots_with_kafka(
    client: HarnessClient, kafka_bootstrap: str, pk_table
) -> None:
    warehouse, table = pk_table
    s1 = _write(table, _rows(range(0, 10), "eu") + _rows(range(0, 5), "us"))
    s2 = _write(table, _rows(range(0, 3), "eu", scale=100.0))  # updates three keys
    topic = new_topic(kafka_bootstrap)
    offsets = produce(
        kafka_bootstrap,
        topic,
        [json.dumps(r).encode() for r in _rows(range(100, 103), "eu")],
    )
    client.create_table("orders", [{"name": f.name, "type": str(f.type)} for f in SCHEMA])
    config = {"warehouse": warehouse, "identifier": "db.orders", "target_task_bytes": 1}
    v1 = client.add_source("orders", "cold", "paimon", config=config, state={"snapshot_id": s1})
    client.add_source(
        "orders",
        "hot",
        "kafka",
        config={"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0},
        state={"low": 0, "high": max(offsets) + 1},
    )
    v2 = client.commit("orders", updates=[{"source": "cold", "state": {"snapshot_id": s2}}])

    def amounts(version: int) -> dict[tuple[str, int], float]:
        t = client.read("orders", version=version)
        return {(r["region"], r["id"]): r["amount"] for r in t.to_pylist()}

    old, new = amounts(v1), amounts(v2)
    assert len(old) == 15 and old[("eu", 1)] == 1.0
    assert len(new) == 18 and new[("eu", 1)] == 100.0 and new[("eu", 5)] == 5.0
    assert new[("eu", 101)] == 101.0  # the Kafka rows beside the Paimon ones

    # Paimon partitions prune splits: only the 'us' partition's files are planned.
    def tasks(**read: object) -> int:
        info = client.flight_info("orders", **read)
        return {s["name"]: s["tasks"] for s in json.loads(info.app_metadata)["sources"]}["cold"]

    assert tasks(filter="region = 'us'") < tasks()
    us = client.read("orders", filter="region = 'us'").column("id").to_pylist()
    assert sorted(us) == list(range(5))


def test_primary_key_table_refuses_since(client: HarnessClient, pk_table) -> None:
    warehouse, table = pk_table
    s1 = _write(table, _rows(range(0, 3), "eu"))
    client.create_table("orders", [{"name": f.name, "type": str(f.type)} for f in SCHEMA])
    config = {"warehouse": warehouse, "identifier": "db.orders"}
    v1 = client.add_source("orders", "cold", "paimon", config=config, state={"snapshot_id": s1})
    s2 = _write(table, _rows(range(3, 6), "eu"))
    v2 = client.commit("orders", updates=[{"source": "cold", "state": {"snapshot_id": s2}}])
    with pytest.raises(InvalidArgument, match="primary-key table"):
        client.flight_info("orders", version=v2, since=v1)
