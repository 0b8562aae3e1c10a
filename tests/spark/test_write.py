"""df.write.format("harness-flight"): append, overwrite, and failed writes that leave nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from clients import HarnessClient
from tests.gateway.helpers import IcebergFixture

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ARROW = pa.schema([("id", pa.int64()), ("name", pa.string())])


@pytest.fixture
def targets(gateway, client: HarnessClient, tmp_path: Path, iceberg: IcebergFixture) -> dict:
    server, _ = gateway
    iceberg.create("sw", ARROW)
    (tmp_path / "out").mkdir()
    client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}])
    client.commit(
        "t",
        add_sources=[
            {
                "name": "files",
                "kind": "files",
                "config": {"root": str(tmp_path / "out")},
                "state": {"files": []},
            },
            {
                "name": "ice",
                "kind": "iceberg",
                "config": iceberg.source_config("sw"),
                "state": {"snapshot_id": None},
            },
        ],
    )
    return {"uri": f"grpc://127.0.0.1:{server.port}", "dir": tmp_path / "out"}


def write(df, uri: str, source: str, mode: str = "append") -> None:
    df.write.format("harness-flight").option("uri", uri).option("table", "t").option(
        "source", source
    ).mode(mode).save()


@pytest.mark.parametrize("source", ["files", "ice"])
def test_append_and_overwrite_then_read_back(
    spark, client: HarnessClient, targets: dict, source: str
) -> None:
    df = spark.range(0, 1000, numPartitions=4).selectExpr("id", "concat('n', id) AS name")
    write(df, targets["uri"], source)
    v1 = client.describe("t").version
    write(df.where("id < 10"), targets["uri"], source)
    read = client.read("t", sources=[source])
    assert read.num_rows == 1010
    write(
        spark.range(5000, 5003).selectExpr("id", "concat('o', id) AS name"),
        targets["uri"],
        source,
        mode="overwrite",
    )
    assert sorted(client.read("t", sources=[source]).column("id").to_pylist()) == [5000, 5001, 5002]
    assert (
        client.read("t", version=v1, sources=[source]).num_rows == 1000
    )  # old pins keep their data
    back = (
        spark.read.format("harness-flight")
        .option("uri", targets["uri"])
        .option("table", "t")
        .load()
    )
    assert back.where("id >= 5000").count() == 3
    assert client.history("t", limit=1)[0].summary["operation"] == "spark-overwrite"


def test_failed_write_leaves_no_commit_and_no_files(
    spark, client: HarnessClient, targets: dict
) -> None:
    from pyspark.sql.functions import udf

    @udf("string")
    def explode_on_777(i: int) -> str:
        if i == 777:
            raise ValueError("boom")
        return f"n{i}"

    before = client.describe("t").version
    df = spark.range(0, 1000, numPartitions=4).select("id", explode_on_777("id").alias("name"))
    with pytest.raises(Exception, match="boom"):
        write(df, targets["uri"], "files")
    assert client.describe("t").version == before
    assert os.listdir(targets["dir"]) == []
