"""Maintenance never breaks a read of a retained version, while a mover runs: version retention
by table property, cleanup of files no retained version lists, Iceberg snapshot expiry below the
oldest pin, and the Kafka retention guard."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clients import HarnessClient
from flight_gateway.catalog import Catalog
from flight_gateway.core.maintenance import run_once
from pipelines.mover import Mover
from tests.gateway.helpers import IcebergFixture
from tests.gateway.kafka_helpers import new_topic, produce

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("id", pa.int64())])


def _ids(client: HarnessClient, version: int) -> list[int]:
    return sorted(client.read("t", version=version).column("id").to_pylist())


@pytest.mark.slow
def test_maintenance_keeps_every_retained_version_readable(
    gateway, client: HarnessClient, kafka_bootstrap: str, tmp_path: Path
) -> None:
    _server, catalog = gateway
    assert isinstance(catalog, Catalog)
    data = tmp_path / "data"
    data.mkdir()
    ice = IcebergFixture(tmp_path / "ice")
    ice.create("cold", SCHEMA)
    topic = new_topic(kafka_bootstrap)
    client.create_table(
        "t", [{"name": "id", "type": "int64"}], properties={"retention.keep_last": 4}
    )
    client.commit(
        "t",
        add_sources=[
            {"name": "f", "kind": "files", "config": {"root": str(data)}, "state": {"files": []}},
            {
                "name": "ice",
                "kind": "iceberg",
                "config": ice.source_config("cold"),
                "state": {"snapshot_id": None},
            },
            {
                "name": "k",
                "kind": "kafka",
                "state": {"low": 0, "high": 0},
                "config": {"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0},
            },
        ],
    )
    # Files maintenance must never touch: one the harness did not write, one too young. Files
    # named as this catalog names its own (``harness-<tag>-``) are its to delete when unused.
    tag = catalog.catalog_tag
    pq.write_table(pa.table({"id": [0]}), data / "not-ours.parquet")
    stale = data / f"harness-{tag}-stale.parquet"
    pq.write_table(pa.table({"id": [0]}), stale)
    os.utime(stale, (time.time() - 7200, time.time() - 7200))

    seen: dict[int, list[int]] = {}
    stop = threading.Event()
    failures: list[BaseException] = []

    def mover() -> None:
        m = Mover(client, "t", "k", "ice")
        try:
            while not stop.is_set():
                m.run_once()
        except BaseException as e:
            failures.append(e)

    thread = threading.Thread(target=mover)
    thread.start()
    try:
        for i in range(8):
            offsets = produce(
                kafka_bootstrap,
                topic,
                [json.dumps({"id": 1000 + 10 * i + j}).encode() for j in range(10)],
            )
            with client.lock("t", ["k"], owner="ingest", ttl_s=30, wait_s=30) as lk:
                low = client.describe("t").source("k").state["low"]
                client.commit(
                    "t",
                    lock=lk,
                    updates=[{"source": "k", "state": {"low": low, "high": max(offsets) + 1}}],
                )
            client.put("t", pa.table({"id": [10 * i + j for j in range(5)]}), source="f")
            if i % 3 == 2:  # compaction: one file replaces the list, old files go unlisted
                files = client.describe("t").source("f").state["files"]
                merged = pa.concat_tables([pq.read_table(data / f) for f in files])
                compacted = f"harness-{tag}-compacted-{i}.parquet"
                pq.write_table(merged, data / compacted)
                client.commit("t", updates=[{"source": "f", "state": {"files": [compacted]}}])
            for v in range(client.describe("t").version - 1, client.describe("t").version + 1):
                seen.setdefault(v, _ids(client, v))
            report = run_once(catalog, grace_s=0)  # no DoPut in flight here: delete at once
            assert not report.to_json()["lost"]
            oldest = min(h.version for h in client.history("t"))
            for v, ids in seen.items():  # every version maintenance kept reads as it did
                if v >= oldest:
                    assert _ids(client, v) == ids, v
    finally:
        stop.set()
        thread.join(60)
    assert not failures, failures

    run_once(catalog, grace_s=0)
    history = client.history("t")
    assert len(history) == 4  # retention.keep_last
    listed = {
        f
        for h in history
        for f in client.describe("t", version=h.version).source("f").state["files"]
    }
    on_disk = {p.name for p in data.iterdir()}
    assert "not-ours.parquet" in on_disk and stale.name not in on_disk
    assert {n for n in on_disk if n.startswith("harness-")} == listed
    pinned = {
        client.describe("t", version=h.version).source("ice").state["snapshot_id"] for h in history
    }
    table = ice.catalog.load_table("db.cold")
    snapshots = {s.snapshot_id for s in table.metadata.snapshots}
    assert pinned - {None} <= snapshots
    oldest_pin = min(table.snapshot_by_id(s).timestamp_ms for s in pinned if s is not None)
    assert all(s.timestamp_ms >= oldest_pin for s in table.metadata.snapshots)
