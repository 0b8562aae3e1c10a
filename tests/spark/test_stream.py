"""readStream.format("harness-flight"): every row exactly once across restarts of the query."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clients import HarnessClient
from pipelines.mover import Mover
from tests.gateway.helpers import IcebergFixture, write_parquet
from tests.gateway.kafka_helpers import json_values, new_topic, produce

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ARROW = pa.schema([("id", pa.int64()), ("payload", pa.string())])


def test_stream_delivers_each_row_once_across_restarts(
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
    iceberg.create("streamed", ARROW)
    (tmp_path / "files").mkdir()
    client.create_table(
        "t", [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"}]
    )
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
                "config": iceberg.source_config("streamed"),
                "state": {"snapshot_id": None},
            },
            {
                "name": "files",
                "kind": "files",
                "config": {"root": str(tmp_path / "files")},
                "state": {"files": []},
            },
        ],
    )
    next_id = [0]

    def ingest(n: int) -> None:
        ids = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        offs = produce(
            kafka_bootstrap, topic, json_values([{"id": i, "payload": "k"} for i in ids])
        )
        with client.lock("t", ["k0"], owner="ingester", wait_s=30) as lock:
            low = client.describe("t").source("k0").state["low"]
            client.commit(
                "t",
                lock=lock,
                updates=[{"source": "k0", "state": {"low": low, "high": max(offs) + 1}}],
            )

    def add_file(n: int) -> None:
        ids = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        name = f"f{ids[0]}.parquet"
        write_parquet(
            tmp_path / "files" / name, pa.table({"id": ids, "payload": ["f"] * n}, schema=ARROW)
        )
        files = client.describe("t").source("files").state["files"]
        client.commit("t", updates=[{"source": "files", "state": {"files": [*files, name]}}])

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_query() -> None:
        stream = (
            spark.readStream.format("harness-flight").option("uri", uri).option("table", "t").load()
        )
        q = (
            stream.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
        assert q.exception() is None

    def delivered() -> list[int]:
        files = sorted(out.glob("*.parquet"))
        return sorted(i for f in files for i in pq.read_table(f).column("id").to_pylist())

    mover = Mover(client, "t", "k0", "cold", wait_s=30)
    ingest(30)
    run_query()
    assert delivered() == list(range(30))
    # Between runs: the moved rows must not come again; new Kafka rows and a new file must.
    mover.run_once()
    ingest(20)
    add_file(5)
    mover.run_once()
    ingest(10)
    run_query()  # a restart from the same checkpoint
    assert delivered() == list(range(65))
    run_query()  # nothing new: nothing delivered twice
    assert delivered() == list(range(65))
