"""Manifest entries decoded once per process (planners.iceberg_manifests): every snapshot plans
exactly the files pyiceberg's own planner finds, a new snapshot decodes only its new manifests,
and a cached manifest is still checked against the reading source's allow-list."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.expressions import EqualTo, GreaterThanOrEqual

from flight_gateway.protocol.errors import Unauthorized
from planners import iceberg_manifests, locations
from planners.iceberg_io import GUARD_PROPERTY, GuardedFileIO
from planners.iceberg_mor import plan
from planners.kind import Reach
from tests.gateway.helpers import IcebergFixture

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])


def _rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()), "v": ["x"] * n})


def _planned(table, snapshot_id: int, row_filter=None) -> tuple[list[str], list[str]]:  # type: ignore[no-untyped-def]
    """(files the harness plans, files pyiceberg's own planner plans) for one snapshot."""
    kwargs = {"snapshot_id": snapshot_id}
    if row_filter is not None:
        kwargs["row_filter"] = row_filter
    scan = table.scan(**kwargs)
    ours = sorted(t.file.file_path for t in plan(scan).tasks)
    theirs = sorted(t.file.file_path for t in table.scan(**kwargs).plan_files())
    return ours, theirs


def test_every_snapshot_plans_what_pyiceberg_plans(tmp_path: Path) -> None:
    iceberg = IcebergFixture(tmp_path)
    table = iceberg.create("t", SCHEMA)
    for i in range(6):
        table.append(_rows(i * 10, 10))
    table.delete(EqualTo("id", 3))  # rewrites one file: a manifest with DELETED entries
    table.delete(GreaterThanOrEqual("id", 50))  # drops a whole file
    table.append(_rows(100, 5))
    table = iceberg.catalog.load_table("db.t")
    snapshots = [s.snapshot_id for s in table.snapshots()]
    assert len(snapshots) >= 9
    for _ in range(2):  # cold, then from the cache
        for snap in snapshots:
            for row_filter in (None, GreaterThanOrEqual("id", 40)):
                ours, theirs = _planned(table, snap, row_filter)
                assert ours == theirs


def test_a_new_snapshot_decodes_only_its_new_manifest(tmp_path: Path) -> None:
    iceberg = IcebergFixture(tmp_path)
    table = iceberg.create("t", SCHEMA)
    for i in range(20):
        table.append(_rows(i * 10, 10))
    plan(table.scan())
    before = iceberg_manifests.stats()
    table.append(_rows(1000, 10))
    planned = plan(table.scan())
    after = iceberg_manifests.stats()
    assert len(planned.tasks) == 21
    assert after["misses"] - before["misses"] == 1  # the new snapshot's own manifest
    assert after["hits"] - before["hits"] >= 20


class _Refuse:
    key = "test-refuse-everything"

    def check(self, source: str | None, reaches: Sequence[Reach]) -> None:
        raise Unauthorized("outside every allow-list")


def test_a_cached_manifest_is_still_checked(tmp_path: Path) -> None:
    iceberg = IcebergFixture(tmp_path)
    table = iceberg.create("t", SCHEMA)
    table.append(_rows(0, 10))
    manifest = table.current_snapshot().manifests(table.io)[0]
    assert len(iceberg_manifests.entries(table.io, manifest)) == 1  # now cached
    refusing = GuardedFileIO({GUARD_PROPERTY: locations.register_guard(_Refuse())})
    with pytest.raises(Unauthorized):
        iceberg_manifests.entries(refusing, manifest)


def test_the_cache_stays_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    iceberg_manifests.clear()
    monkeypatch.setattr(iceberg_manifests, "MAX_ENTRIES", 8)
    iceberg = IcebergFixture(tmp_path)
    table = iceberg.create("t", SCHEMA)
    for i in range(12):
        table.append(_rows(i * 10, 10))
    assert len(plan(table.scan()).tasks) == 12
    assert iceberg_manifests.stats()["entries"] <= 8


def test_an_overwrite_reads_the_entries_readers_decoded(tmp_path: Path) -> None:
    """A compaction's rewrite under the source's lease: pyiceberg's overwrite fetches every
    manifest of its parent twice; once the gateway shares the cache with pyiceberg, none is
    decoded again, and the rewritten table holds exactly the rows it held."""
    import pyarrow.parquet as pq

    from planners.iceberg import lineage_after
    from planners.iceberg_rewrite import rewrite

    iceberg_manifests.cache_pyiceberg_reads()
    iceberg = IcebergFixture(tmp_path)
    table = iceberg.create("t", SCHEMA)
    for i in range(8):
        table.append(_rows(i * 10, 10))
    plan(table.scan())  # the source's readers
    rows = table.scan().to_arrow()
    path = f"{table.location().removeprefix('file://')}/data/compacted.parquet"
    pq.write_table(rows, path)
    before = iceberg_manifests.stats()
    rewrite(table, "t", table.current_snapshot().snapshot_id, [path], "compact-1", lineage_after)
    after = iceberg_manifests.stats()
    assert after["misses"] == before["misses"]
    assert after["hits"] - before["hits"] >= 3 * 8  # the rewrite's read, pyiceberg's two
    table = iceberg.catalog.load_table("db.t")
    assert [t.file.file_path for t in table.scan().plan_files()] == [path]
    assert table.scan().to_arrow().sort_by("id").equals(rows.sort_by("id"))


def test_readers_new_to_a_manifest_decode_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight planners meeting a manifest this process has not decoded (a restarted replica's
    readers, all at once) wait for the one decoding it."""
    import threading
    import time

    iceberg_manifests.clear()
    iceberg = IcebergFixture(tmp_path)
    table = iceberg.create("t", SCHEMA)
    table.append(_rows(0, 10))
    manifest = table.current_snapshot().manifests(table.io)[0]
    real = iceberg_manifests._fetch or type(manifest).fetch_manifest_entry
    decoded: list[str] = []

    def slow(m: Any, io: Any, discard_deleted: bool = True) -> list[Any]:
        decoded.append(str(m.manifest_path))
        time.sleep(0.2)
        return list(real(m, io, discard_deleted=discard_deleted))

    monkeypatch.setattr(iceberg_manifests, "_fetch", slow)
    got: list[int] = []
    threads = [
        threading.Thread(target=lambda: got.append(len(iceberg_manifests.entries(table.io, manifest))))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [1] * 8 and len(decoded) == 1
