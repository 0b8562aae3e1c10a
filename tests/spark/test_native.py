"""Spark's native readers on the pinned cold files, ``harness-flight`` for the hot rest: the
same rows as the client's read at the same version, with renamed, added and widened columns."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clients import HarnessClient
from spark_datasource.native import read_native, register_native_view
from tests.gateway.kafka_helpers import new_topic, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _key(row: tuple) -> tuple:
    return tuple((v is None, v if v is not None else 0) for v in row)


def _rows(df) -> list[tuple]:
    return sorted((tuple(r) for r in df.collect()), key=_key)


def _expected(client: HarnessClient, **read) -> list[tuple]:
    return sorted((tuple(r.values()) for r in client.read("t", **read).to_pylist()), key=_key)


def test_native_read_equals_the_client_read(
    spark, client: HarnessClient, kafka_bootstrap: str, tmp_path: Path, iceberg, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="spark_datasource.native")
    # Old files: "qty" is int32 and the column later renamed "amount" is still called "amt".
    old = pa.table(
        {
            "id": pa.array(range(0, 20), pa.int64()),
            "amt": [i * 1.5 for i in range(20)],
            "qty": pa.array([i % 5 for i in range(20)], pa.int32()),
        }
    )
    pq.write_table(old, tmp_path / "old.parquet")
    client.create_table(
        "t",
        [
            {"name": "id", "type": "int64"},
            {"name": "amt", "type": "float64"},
            {"name": "qty", "type": "int32"},
        ],
    )
    client.add_source(
        "t",
        "cold",
        "files",
        config={"root": str(tmp_path), "direct": True},
        state={"files": ["old.parquet"]},
    )
    client.evolve_schema(
        "t",
        [
            {"op": "rename_column", "name": "amt", "new_name": "amount"},
            {"op": "widen_type", "name": "qty", "type": "int64"},
            {"op": "add_column", "name": "note", "type": "string"},
        ],
    )
    new = pa.table(
        {
            "id": pa.array(range(20, 30), pa.int64()),
            "amount": [i * 1.5 for i in range(20, 30)],
            "qty": pa.array(range(20, 30), pa.int64()),
            "note": [f"n{i}" for i in range(20, 30)],
        }
    )
    pq.write_table(new, tmp_path / "new.parquet")
    client.commit(
        "t", updates=[{"source": "cold", "state": {"files": ["old.parquet", "new.parquet"]}}]
    )
    ice_table = iceberg.create("ice", new.schema)
    ice_table.append(
        pa.table(
            {
                "id": pa.array(range(30, 35), pa.int64()),
                "amount": [1.0] * 5,
                "qty": pa.array([7] * 5, pa.int64()),
                "note": ["ice"] * 5,
            }
        )
    )
    client.add_source(
        "t",
        "ice",
        "iceberg",
        config={**iceberg.source_config("ice"), "direct": True},
        state={"snapshot_id": ice_table.current_snapshot().snapshot_id},
    )
    topic = new_topic(kafka_bootstrap)
    offsets = produce(
        kafka_bootstrap,
        topic,
        [
            json.dumps({"id": 100 + i, "amount": 2.0, "qty": 1, "note": "hot"}).encode()
            for i in range(5)
        ],
    )
    version = client.add_source(
        "t",
        "hot",
        "kafka",
        state={"low": 0, "high": max(offsets) + 1},
        config={"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0},
    )

    whole = read_native(spark, client.uri, "t")
    # Both cold sources (files: two physical layouts) went to Spark's reader, Kafka to Flight.
    assert "2 direct task(s) in 3 native read(s), 1 Flight endpoint(s)" in caplog.text
    assert whole.columns == ["id", "amount", "qty", "note"]
    assert _rows(whole) == _expected(client, version=version)
    cols, flt = ["note", "id", "qty"], "qty >= 3 AND (note IS NULL OR note <> 'hot')"
    part = read_native(spark, client.uri, "t", columns=cols, filter=flt)
    assert _rows(part) == _expected(client, columns=cols, filter=flt)
    assert len(_rows(part)) > 0

    # Pinned: a later commit does not change what an earlier pinned read returns.
    client.commit("t", updates=[{"source": "cold", "state": {"files": ["new.parquet"]}}])
    assert _rows(read_native(spark, client.uri, "t", version=version)) == _expected(
        client, version=version
    )
    register_native_view(spark, "t_native", client.uri, "t")
    got = spark.sql("SELECT count(*) AS n, sum(qty) AS q FROM t_native WHERE id < 100").collect()[0]
    want = client.read("t", filter="id < 100")
    assert (got["n"], got["q"]) == (want.num_rows, sum(want.column("qty").to_pylist()))
