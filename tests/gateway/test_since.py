"""Reads of the rows added since a version (``since``), kind by kind."""

from __future__ import annotations

import pyarrow as pa
import pytest

from clients import HarnessClient
from tests.gateway.helpers import IcebergFixture

ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])


def added(client: HarnessClient, since: int) -> list[int]:
    info = client.flight_info("t", since=since)
    parts = [client.read_endpoint(ep).read_all() for ep in info.endpoints]
    return sorted(i for p in parts for i in p.column("id").to_pylist())


@pytest.mark.integration
def test_rows_appended_to_iceberg_by_doput_are_added_rows(
    client: HarnessClient, iceberg: IcebergFixture
) -> None:
    # Regression: DoPut tagged its Iceberg snapshot like a mover's relocation, so streaming
    # readers skipped the rows it appended.
    iceberg.create("s", ARROW)
    client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "v", "type": "string"}])
    client.add_source(
        "t", "ice", "iceberg", config=iceberg.source_config("s"), state={"snapshot_id": None}
    )
    v0 = client.pinned_version(client.flight_info("t"))
    client.put("t", pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}, schema=ARROW))
    v1 = client.pinned_version(client.flight_info("t"))
    client.put("t", pa.table({"id": [4], "v": ["d"]}, schema=ARROW))
    assert added(client, v0) == [1, 2, 3, 4]
    assert added(client, v1) == [4]


def test_added_rows_at_an_older_version_are_that_versions(client: HarnessClient, tmp_path) -> None:
    # Regression: a ``since`` read at a version older than the newest took the newest commits'
    # summaries and found no change up to the version it read, so it returned nothing.
    import pyarrow.parquet as pq

    client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "v", "type": "string"}])
    client.add_source("t", "f", "files", config={"root": str(tmp_path)}, state={"files": []})
    files: list[str] = []
    versions = []
    for n, ids in enumerate(([1, 2], [3], [4, 5])):
        pq.write_table(
            pa.table({"id": ids, "v": ["x"] * len(ids)}, schema=ARROW), tmp_path / f"{n}.parquet"
        )
        files.append(f"{n}.parquet")
        versions.append(client.commit("t", updates=[{"source": "f", "state": {"files": files}}]))
    info = client.flight_info("t", version=versions[1], since=versions[0])
    parts = [client.read_endpoint(ep).read_all() for ep in info.endpoints]
    assert sorted(i for p in parts for i in p.column("id").to_pylist()) == [3]
