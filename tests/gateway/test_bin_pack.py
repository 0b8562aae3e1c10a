"""Bin-pack compaction (``pipelines.compaction.bin_pack``, ``commit_write`` with ``replaces``):
only a source's small files are rewritten, as one; its large files stay listed as they were,
rows written meanwhile stay, and what it replaces must still be current (DESIGN §18). Files
and Iceberg sources; for Iceberg the rows are checked against pyiceberg's own scan."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import Conflict, InvalidArgument
from pipelines.compaction import bin_pack, compact, file_sizes, filesystem, small_files
from tests.gateway.helpers import IcebergFixture

pytestmark = pytest.mark.integration
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
COLUMNS = [{"name": "id", "type": "int64", "nullable": False}, {"name": "v", "type": "string"}]
SMALL = 16 << 10  # the 20,000-row file is larger, the 25-row ones smaller (checked below)


def rows(first: int, n: int) -> pa.Table:
    return pa.table({"id": range(first, first + n), "v": [f"r{i}" for i in range(n)]}, SCHEMA)


def ids(client: HarnessClient, **kw: Any) -> list[int]:
    return sorted(client.read("t", **kw).column("id").to_pylist())


def listed(client: HarnessClient) -> list[str]:
    """The source's files at the table's version, as its direct tasks name them."""
    info = client.flight_info("t", sources=["s"], direct=True)
    tasks = [client.direct_task(ep) for ep in info.endpoints]
    return sorted(f for t in tasks if t is not None for f in t.files)


@pytest.fixture(params=["files", "iceberg"])
def source(request: pytest.FixtureRequest, client: HarnessClient, tmp_path: Path) -> Any:
    """Table ``t``, source ``s`` of the kind (direct tasks allowed): one file of 20,000 rows,
    then four of 25. Returns the pyiceberg table for Iceberg, else None."""
    table = None
    if request.param == "files":
        config: dict[str, Any] = {"root": str(tmp_path / "files"), "direct": True}
        state: dict[str, Any] = {"files": []}
    else:
        iceberg = IcebergFixture(tmp_path)
        table = iceberg.catalog.create_table("db.s", schema=SCHEMA)
        config = {**iceberg.source_config("s"), "direct": True}
        state = {"snapshot_id": None}
    client.create_table("t", COLUMNS)
    client.add_source("t", "s", request.param, config=config, state=state)
    client.put("t", rows(0, 20_000))
    for first in range(20_000, 20_100, 25):
        client.put("t", rows(first, 25))
    return table


def test_bin_pack_rewrites_the_small_files_only(client: HarnessClient, source: Any) -> None:
    before = listed(client)
    sizes = dict(zip(before, file_sizes(before), strict=True))
    large = [f for f, size in sizes.items() if size >= SMALL]
    assert len(large) == 1 and len(before) == 5  # the setup is as the test needs it
    version = client.describe("t").version
    result = bin_pack(client, "t", "s", small_bytes=SMALL, min_files=2)
    assert result is not None and result.rows == 100
    after = listed(client)
    assert len(after) == 2 and large[0] in after  # the large file stays where it was
    assert ids(client) == list(range(20_100))
    assert ids(client, version=version) == list(range(20_100))  # the pinned version too
    assert client.history("t", limit=1)[0].summary.get("operation") == "compaction"
    if source is not None:  # Iceberg: its own reader agrees
        source.refresh()
        assert sorted(source.scan().to_arrow().column("id").to_pylist()) == list(range(20_100))
    assert bin_pack(client, "t", "s", small_bytes=SMALL, min_files=2) is None  # one left


def test_a_partial_rewrite_keeps_rows_written_meanwhile(client: HarnessClient, source: Any) -> None:
    pinned = client.describe("t").version
    small = small_files(client, "t", "s", pinned, SMALL)
    assert small is not None and len(small) == 4
    client.put("t", rows(50_000, 10))  # a writer commits while the rewrite writes
    begun = client.begin_write("t", "s")
    path = f"{begun['location']}/{uuid.uuid4().hex}.parquet"
    fs, local = filesystem(path)
    with fs.open_output_stream(local) as out:
        pq.write_table(rows(20_000, 100), out)
    client.commit_write("t", begun["write_id"], [path], source="s", overwrite=True,
                        relocation=True, rows=100, read_version=pinned,
                        replaces=[f for _, f in small])  # fmt: skip
    assert ids(client) == list(range(20_100)) + list(range(50_000, 50_010))
    assert len(listed(client)) == 3  # the large file, the new one, the writer's


def test_a_partial_rewrite_of_rewritten_files_conflicts(client: HarnessClient, source: Any) -> None:
    """The small files were compacted whole since the bin-pack read them: CONFLICT, nothing
    committed; bin_pack itself reads again and finds nothing left to pack."""
    pinned = client.describe("t").version
    small = small_files(client, "t", "s", pinned, SMALL)
    assert small is not None
    compact(client, "t", "s")
    begun = client.begin_write("t", "s")
    path = f"{begun['location']}/{uuid.uuid4().hex}.parquet"
    fs, local = filesystem(path)
    with fs.open_output_stream(local) as out:
        pq.write_table(rows(20_000, 100), out)
    version = client.describe("t").version
    with pytest.raises(Conflict):
        client.commit_write("t", begun["write_id"], [path], source="s", overwrite=True,
                            relocation=True, rows=100, read_version=pinned,
                            replaces=[f for _, f in small])  # fmt: skip
    client.abort_write("t", begun["write_id"], "s")
    assert client.describe("t").version == version
    assert ids(client) == list(range(20_100))
    assert bin_pack(client, "t", "s", small_bytes=SMALL, min_files=2) is None


@pytest.mark.parametrize(
    "body, message",
    [
        ({"replaces": ["/nowhere/x.parquet"]}, "not"),  # not a file of the version read
        ({"replaces": []}, "replaces"),
        ({"replaces": [7]}, "replaces"),
        ({"replaces": "x.parquet"}, "replaces"),
    ],
)
def test_replaces_is_checked_and_nothing_is_committed(
    client: HarnessClient, source: Any, body: dict[str, Any], message: str
) -> None:
    version = client.describe("t").version
    begun = client.begin_write("t", "s")
    request = {"table": "t", "write_id": begun["write_id"], "source": "s", "paths": [],
               "overwrite": True, "relocation": True, "read_version": version, **body}  # fmt: skip
    with pytest.raises(InvalidArgument, match=message):
        client.action("harness.commit_write", request)
    del request["read_version"]
    with pytest.raises(InvalidArgument):
        client.action("harness.commit_write", request)
    client.abort_write("t", begun["write_id"], "s")
    assert client.describe("t").version == version
    assert ids(client) == list(range(20_100))
