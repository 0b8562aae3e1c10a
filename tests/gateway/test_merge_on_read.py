"""Merge-on-read through the harness: an Iceberg table with five data sequence numbers and
interleaved inserts, equality deletes (upserts) and position deletes reads the same through
Flight, direct tasks (tasks with deletes fall back to the gateway) and Flight SQL as through
DuckDB's iceberg extension, at the latest and at an older pinned snapshot; each delete file is
decoded once per read however many tasks it applies to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from clients import HarnessClient
from planners import iceberg_mor
from planners.iceberg_deletes import write_changes, write_position_deletes
from tests.gateway.helpers import IcebergFixture
from tests.planners.test_iceberg_deletes import SCHEMA, data_paths, keys, rows

pytestmark = pytest.mark.integration
COLUMNS = [{"name": f.name, "type": str(f.type)} for f in SCHEMA]


@pytest.fixture(scope="module")
def duck() -> Iterator[Any]:
    from tests.planners.test_iceberg_deletes import duck as make

    yield from make.__wrapped__()  # type: ignore[attr-defined]


def upsert(table: Any, data: pa.Table, delete_ids: list[int]) -> int:
    ids = data.column("id").to_pylist() + delete_ids
    return write_changes(table, data=data, deletes=keys(*ids), equality_ids=[1])


@pytest.fixture
def mor(tmp_path: Path, client: HarnessClient) -> dict[str, Any]:
    """Table ``t`` over an Iceberg table changed five times; returns its snapshots."""
    iceberg = IcebergFixture(tmp_path)
    table = iceberg.catalog.create_table(
        "db.mor", schema=SCHEMA, properties={"format-version": "2"}
    )
    table.append(rows(*[(i, f"a{i}", i) for i in range(0, 50)]))  # seq 1
    table.append(rows(*[(i, f"b{i}", i) for i in range(50, 100)]))  # seq 2
    s2 = table.current_snapshot().snapshot_id
    upsert(table, rows((5, "u5", 500), (60, "u60", 600)), [7, 61])  # seq 3
    s3 = table.current_snapshot().snapshot_id
    first = next(p for p in data_paths(table) if 0 in ids_in(p))  # the first append's file
    write_position_deletes(table, {first: [0, 1]})  # seq 4: rows 0 and 1 of one file
    upsert(table, rows((5, "v5", 5000), (200, "n200", 2)), [8, 60])  # seq 5: 5 again, 60 gone
    client.create_table("t", COLUMNS)
    config = {**iceberg.source_config("mor"), "direct": True, "target_task_bytes": 1}
    client.add_source("t", "ice", "iceberg", config=config, state={"snapshot_id": s3})
    v3 = client.describe("t").version
    latest = table.current_snapshot().snapshot_id
    client.commit("t", updates=[{"source": "ice", "state": {"snapshot_id": latest}}])
    return {"table": table, "v3": v3, "s3": s3, "latest": latest, "s2": s2}


def ids_in(path: str) -> list[int]:
    import pyarrow.parquet as pq

    return pq.read_table(path.removeprefix("file://"), columns=["id"]).column("id").to_pylist()


def _sorted(t: pa.Table) -> list[dict[str, Any]]:
    return t.select([f.name for f in SCHEMA]).sort_by("id").to_pylist()


def duck_read(duck: Any, table: Any, snapshot: int, where: str = "true") -> list[dict[str, Any]]:
    sql = (
        f"SELECT * FROM iceberg_scan('{table.metadata_location}', snapshot_from_id => {snapshot})"
        f" WHERE {where} ORDER BY id"
    )
    return duck.execute(sql).to_arrow_table().to_pylist()  # type: ignore[no-any-return]


def test_every_path_reads_what_duckdb_reads(
    client: HarnessClient, mor: dict[str, Any], duck: Any
) -> None:
    table = mor["table"]
    want = duck_read(duck, table, mor["latest"])
    ids = [r["id"] for r in want]
    assert 0 not in ids and 7 not in ids and 60 not in ids and 200 in ids  # the oracle agrees
    assert [r for r in want if r["id"] == 5] == [{"id": 5, "name": "v5", "qty": 5000}]
    assert _sorted(client.read("t")) == want
    assert _sorted(client.read("t", direct=True)) == want
    assert _sorted(client.sql("SELECT * FROM t")) == want
    # an older pinned version reads its own sequence numbers
    assert _sorted(client.read("t", version=mor["v3"])) == duck_read(duck, table, mor["s3"])
    # filters and projections without the key column
    assert _sorted(client.read("t", filter="qty > 40")) == duck_read(
        duck, table, mor["latest"], "qty > 40"
    )
    names = sorted(client.read("t", columns=["name"]).column("name").to_pylist())
    assert names == sorted(r["name"] for r in want)


def test_each_delete_file_is_decoded_once_per_read(
    client: HarnessClient, mor: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[str] = []
    real = iceberg_mor._decode

    def counting(io: Any, schema: Any, delete: Any) -> pa.Table:
        decoded.append(delete.file_path)
        return real(io, schema, delete)

    monkeypatch.setattr(iceberg_mor, "_decode", counting)
    monkeypatch.setattr(iceberg_mor, "_cache", type(iceberg_mor._cache)())
    info = client.flight_info("t")
    assert len(info.endpoints) >= 3  # one task per data file, most with deletes to apply
    client.read("t")
    assert len(decoded) == len(set(decoded)) == 2  # two equality delete files in the table


@pytest.mark.slow
def test_quick_bench_runs_and_agrees_with_duckdb() -> None:
    """``benchmarks/bench_merge_on_read.py`` in quick mode (it asserts the harness, the naive
    plan and DuckDB count the same rows); no timing is asserted here."""
    from benchmarks import bench_merge_on_read

    rows = {r["case"]: r for r in bench_merge_on_read.run(quick=True)}
    assert rows["upserts read back: keys appearing twice"]["value"] == 0
    assert any(c.endswith(": harness vs naive") for c in rows)


def test_compaction_applies_deletes_and_keeps_pinned_reads(
    client: HarnessClient, mor: dict[str, Any], duck: Any
) -> None:
    from pipelines.compaction import compact

    table = mor["table"]
    before = _sorted(client.read("t"))
    old = _sorted(client.read("t", version=mor["v3"]))
    compact(client, "t", "ice")
    table.refresh()
    assert _sorted(client.read("t")) == before
    assert _sorted(client.read("t", version=mor["v3"])) == old  # pinned: the old files
    now = table.current_snapshot().snapshot_id
    assert duck_read(duck, table, now) == before
    # the rewritten files carry no delete to apply: every path reads them directly again
    info = client.flight_info("t", direct=True)
    assert all(client.direct_task(ep) is not None for ep in info.endpoints)
    history = client.history("t", limit=1)[0]
    assert history.summary.get("operation") == "compaction"


def test_schema_evolution_between_delete_files(
    client: HarnessClient, tmp_path: Path, duck: Any
) -> None:
    """The key column renamed and a column added between two delete files: delete files are
    matched by field id, so the old ones still apply under the new name."""
    from pyiceberg.types import LongType

    iceberg = IcebergFixture(tmp_path / "evo")
    table = iceberg.catalog.create_table(
        "db.evo", schema=SCHEMA, properties={"format-version": "2"}
    )
    table.append(rows(*[(i, f"a{i}", i) for i in range(10)]))
    upsert(table, rows((1, "u1", 10)), [2])
    with table.update_schema() as update:
        update.rename_column("id", "key")
        update.add_column("extra", LongType())
    table.refresh()
    new = pa.table(
        {
            "key": pa.array([3, 11], pa.int64()),
            "name": ["u3", "n11"],
            "qty": pa.array([30, 11], pa.int32()),
            "extra": pa.array([7, 8], pa.int64()),
        }
    )
    evolved = pa.schema(
        [pa.field("key", pa.int64(), nullable=False), *list(SCHEMA)[1:], ("extra", pa.int64())]
    )
    write_changes(
        table,
        data=new.cast(evolved),
        deletes=pa.table({"key": pa.array([3, 4, 11], pa.int64())}),
        equality_ids=[1],
    )
    columns = [
        {"name": "key", "type": "int64"},
        {"name": "name", "type": "string"},
        {"name": "qty", "type": "int32"},
        {"name": "extra", "type": "int64"},
    ]
    client.create_table("evo", columns)
    sid = table.current_snapshot().snapshot_id
    client.add_source(
        "evo", "ice", "iceberg", config=iceberg.source_config("evo"), state={"snapshot_id": sid}
    )
    want = (
        duck.execute(f"SELECT * FROM iceberg_scan('{table.metadata_location}') ORDER BY key")
        .to_arrow_table()
        .to_pylist()
    )
    assert [r["key"] for r in want] == [0, 1, 3, 5, 6, 7, 8, 9, 11]
    assert client.read("evo").sort_by("key").to_pylist() == want
