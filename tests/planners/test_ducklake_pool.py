"""Reads of DuckLake sources reuse databases that attached a lake before (the first attach in a
database costs ~130 ms, a later one ~2 ms), attaching the lake afresh each time: a read sees
every snapshot committed before it, and nothing one read leaves behind reaches the next."""

from __future__ import annotations

from pathlib import Path

import pytest

from planners import ducklake_pool
from planners.ducklake import DuckLakeKind, connect
from planners.kind import ColumnSpec, ScanRequest, SourceRef
from tests.gateway.helpers import DuckLakeFixture

COLUMNS = (ColumnSpec(1, "id", "int64"),)


@pytest.fixture
def lake(tmp_path: Path) -> DuckLakeFixture:
    lake = DuckLakeFixture(tmp_path / "lake")
    lake.execute("CREATE TABLE lake.r (id BIGINT)")
    return lake


def _read(lake: DuckLakeFixture, snap: int) -> list[int]:
    source = SourceRef("l", "ducklake", lake.source_config("r"), {}, {"snapshot_id": snap})
    kind = DuckLakeKind()
    request = ScanRequest(source, COLUMNS)
    (task,) = kind.plan(request)
    return sorted(kind.read(request, task).read_all().column("id").to_pylist())


def test_a_reused_database_sees_every_snapshot_committed_before_the_read(lake) -> None:
    first = lake.execute("INSERT INTO lake.r SELECT range FROM range(3)")
    assert _read(lake, first) == [0, 1, 2]
    kept = list(ducklake_pool._idle)
    assert kept  # given back
    later = lake.execute("INSERT INTO lake.r SELECT range FROM range(3, 5)")
    assert _read(lake, later) == [0, 1, 2, 3, 4]
    assert _read(lake, first) == [0, 1, 2]
    assert set(map(id, ducklake_pool._idle)) & set(map(id, kept))  # the same database


def test_a_read_left_early_or_state_left_behind_is_not_given_back(lake) -> None:
    snap = lake.execute("INSERT INTO lake.r SELECT range FROM range(100000)")
    con = connect(lake.config)
    con.execute("ATTACH ':memory:' AS other")  # something a read should not leave
    db = con._db
    con.close()
    assert db not in ducklake_pool._idle
    source = SourceRef("l", "ducklake", lake.source_config("r"), {}, {"snapshot_id": snap})
    kind = DuckLakeKind()
    request = ScanRequest(source, COLUMNS)
    (task,) = kind.plan(request)
    reader = kind.read(request, task)
    reader.read_next_batch()
    reader.close()  # left early
    assert _read(lake, snap) == list(range(100000))


def test_writes_use_a_database_of_their_own(lake) -> None:
    con = connect(lake.config, read_only=False)
    try:
        assert not isinstance(con, ducklake_pool.Pooled)
    finally:
        con.close()


@pytest.fixture
def empty_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process whose pool has made and kept nothing yet."""
    monkeypatch.setattr(ducklake_pool, "_idle", [])
    monkeypatch.setattr(ducklake_pool, "_warmed", False)


def test_the_first_read_takes_the_database_warmed_ahead(lake, empty_pool) -> None:
    DuckLakeKind().warm()
    (warmed,) = ducklake_pool._idle
    DuckLakeKind().warm()  # once per process
    assert ducklake_pool._idle == [warmed]
    snap = lake.execute("INSERT INTO lake.r SELECT range FROM range(3)")
    assert _read(lake, snap) == [0, 1, 2]
    # Taken, read with, given back: a database made for the read would be kept beside it.
    assert ducklake_pool._idle == [warmed]
