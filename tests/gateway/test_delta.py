"""A Delta table written by delta-rs outside the harness, read at pinned versions next to a
Kafka partition in one harness table; partition pruning inside the Delta table; what a Delta
source refuses."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from clients import HarnessClient
from flight_gateway.protocol.errors import InvalidArgument
from tests.gateway.kafka_helpers import new_topic, produce

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("id", pa.int64()), ("region", pa.string()), ("amount", pa.float64())])


def _rows(ids: range, region: str) -> pa.Table:
    return pa.table(
        {"id": list(ids), "region": [region] * len(ids), "amount": [i * 0.5 for i in ids]},
        schema=SCHEMA,
    )


def _ids(client: HarnessClient, **read: object) -> list[int]:
    return sorted(client.read("orders", **read).column("id").to_pylist())


def test_delta_and_kafka_in_one_table_at_pinned_versions(
    client: HarnessClient, kafka_bootstrap: str, tmp_path
) -> None:
    uri = str(tmp_path / "orders_delta")
    write_deltalake(uri, _rows(range(0, 10), "eu"), partition_by=["region"])
    write_deltalake(uri, _rows(range(10, 20), "us"), mode="append")
    topic = new_topic(kafka_bootstrap)
    offsets = produce(
        kafka_bootstrap,
        topic,
        [json.dumps(r).encode() for r in _rows(range(100, 105), "eu").to_pylist()],
    )
    client.create_table("orders", [{"name": f.name, "type": str(f.type)} for f in SCHEMA])
    client.add_source(  # one task per file, so the plan shows how many files survive pruning
        "orders", "cold", "delta", config={"uri": uri, "target_task_bytes": 1}, state={"version": 1}
    )
    v1 = client.add_source(
        "orders",
        "hot",
        "kafka",
        config={"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0},
        state={"low": 0, "high": max(offsets) + 1},
    )
    assert _ids(client) == [*range(0, 20), *range(100, 105)]

    # delta-rs moves the table on; the harness still reads version 1 until a commit says so.
    write_deltalake(uri, _rows(range(20, 25), "eu"), mode="append")
    assert _ids(client) == [*range(0, 20), *range(100, 105)]
    v2 = client.commit(
        "orders", updates=[{"source": "cold", "state": {"version": DeltaTable(uri).version()}}]
    )
    assert _ids(client, version=v2) == [*range(0, 25), *range(100, 105)]
    assert _ids(client, version=v1) == [*range(0, 20), *range(100, 105)]

    # Delta partition values and file statistics prune files before any is opened.
    info = client.flight_info("orders", filter="region = 'us'")
    tasks = {s["name"]: s["tasks"] for s in json.loads(info.app_metadata)["sources"]}
    everything = {
        s["name"]: s["tasks"]
        for s in json.loads(client.flight_info("orders").app_metadata)["sources"]
    }
    assert tasks["cold"] < everything["cold"]
    assert _ids(client, filter="region = 'us'") == list(range(10, 20))
    assert _ids(client, filter="region = 'eu' AND id >= 20") == [*range(20, 25), *range(100, 105)]


def test_delta_refusals(client: HarnessClient, tmp_path) -> None:
    uri = str(tmp_path / "t")
    data = _rows(range(0, 3), "eu").append_column("qty", pa.array([1, 2, 3], pa.int32()))
    write_deltalake(uri, data)
    client.create_table("orders", [{"name": f.name, "type": str(f.type)} for f in data.schema])
    with pytest.raises(InvalidArgument, match="version must be an integer"):
        client.add_source("orders", "d", "delta", config={"uri": uri}, state={"version": -1})
    client.add_source("orders", "d", "delta", config={"uri": uri}, state={"version": 0})
    version = client.describe("orders").version
    with pytest.raises(NotImplementedError, match="widening Delta column"):
        client.evolve_schema("orders", [{"op": "widen_type", "name": "qty", "type": "int64"}])
    assert client.describe("orders").version == version
