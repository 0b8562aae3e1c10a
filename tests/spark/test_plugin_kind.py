"""The out-of-tree ``jsonl`` kind (tests/plugins/harness_jsonl) through Spark: read, append and
streaming, with no edit to the project's code."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clients import HarnessClient

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_spark_reads_appends_and_streams_a_plugin_kind(
    spark, gateway, client: HarnessClient, jsonl_kind: str, tmp_path: Path
) -> None:
    server, _ = gateway
    uri = f"grpc://127.0.0.1:{server.port}"
    client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}])
    client.add_source(
        "t",
        "log",
        jsonl_kind,
        config={"path": str(tmp_path / "log.jsonl")},
        state={"lines": 0, "bytes": 0},
    )
    client.put("t", pa.table({"id": pa.array(range(10), pa.int64()), "name": ["a"] * 10}))

    df = spark.read.format("harness-flight").option("uri", uri).option("table", "t").load()
    assert sorted(r.id for r in df.collect()) == list(range(10))

    more = spark.createDataFrame([(i, "spark") for i in range(10, 30)], "id long, name string")
    more.write.format("harness-flight").option("uri", uri).option("table", "t").mode(
        "append"
    ).save()
    assert sorted(client.read("t").column("id").to_pylist()) == list(range(30))
    assert client.history("t", limit=1)[0].commit_id.startswith("spark-write:")

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_query() -> list[int]:
        stream = spark.readStream.format("harness-flight").option("uri", uri).option("table", "t")
        q = (
            stream.load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
        assert q.exception() is None
        return sorted(
            i for f in out.glob("*.parquet") for i in pq.read_table(f).column("id").to_pylist()
        )

    assert run_query() == list(range(30))
    client.put("t", pa.table({"id": pa.array(range(30, 35), pa.int64()), "name": ["b"] * 5}))
    assert run_query() == list(range(35))  # the new rows once, the old ones not again
