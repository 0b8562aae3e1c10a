"""A DuckLake snapshot as its data files in place (DESIGN §16) only when those files are exactly
its rows; every other snapshot is left to a slice. DuckDB's own DuckLake read is the oracle."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from planners.ducklake import DuckLakeKind, connect
from planners.kind import ColumnSpec, ScanRequest, SourceRef
from tests.gateway.helpers import DuckLakeFixture

COLUMNS = (ColumnSpec(1, "id", "int64"), ColumnSpec(2, "region", "string"))
MANY = "INSERT INTO lake.r SELECT range, 'r' || range FROM range({}, {})"


def _request(lake: DuckLakeFixture, snap: int) -> ScanRequest:
    source = SourceRef("l", "ducklake", lake.source_config("r"), {}, {"snapshot_id": snap})
    return ScanRequest(source, COLUMNS)


def _lake_rows(lake: DuckLakeFixture, snap: int) -> list[tuple]:
    con = connect(lake.config)
    try:
        return sorted(
            con.execute(f"SELECT id, region FROM lake.r AT (VERSION => {snap})").fetchall()
        )
    finally:
        con.close()


@pytest.fixture
def lake(tmp_path: Path) -> DuckLakeFixture:
    lake = DuckLakeFixture(tmp_path / "lake")
    lake.execute("CREATE TABLE lake.r (id BIGINT, region VARCHAR)")
    return lake


def test_files_in_place_hold_exactly_the_snapshots_rows(lake: DuckLakeFixture) -> None:
    lake.execute(MANY.format(0, 300))
    snap = lake.execute(MANY.format(300, 600))
    laid = DuckLakeKind().layout(_request(lake, snap))
    assert laid is not None and len(laid.files) == 2
    assert laid.field_ids == {"id": 1, "region": 2}
    assert sum(f.record_count for f in laid.files) == 600
    paths = [f.path.removeprefix("file://") for f in laid.files]
    got = duckdb.connect().execute(f"SELECT id, region FROM read_parquet({paths!r})").fetchall()
    assert sorted(got) == _lake_rows(lake, snap)


@pytest.mark.parametrize(
    "change",
    [
        "INSERT INTO lake.r VALUES (1000, 'x')",  # a few rows: inlined in the metadata
        "DELETE FROM lake.r WHERE id = 5",  # one row: an inlined delete
        "DELETE FROM lake.r WHERE id < 200",  # a delete file
        "ALTER TABLE lake.r ADD COLUMN score BIGINT DEFAULT 7",  # older files read as 7
    ],
)
def test_a_snapshot_its_files_do_not_hold_exactly_is_left_to_a_slice(
    lake: DuckLakeFixture, change: str
) -> None:
    lake.execute(MANY.format(0, 300))
    snap = lake.execute(change)
    assert DuckLakeKind().layout(_request(lake, snap)) is None


def test_inlined_rows_the_row_count_does_not_show_are_left_to_a_slice(
    lake: DuckLakeFixture,
) -> None:
    """One row inlined in, one deleted inline: the files' row count is the snapshot's, their
    rows are not. Only the snapshots' recorded changes tell (also of another table's inlined
    rows, which must not count)."""
    lake.execute("CREATE TABLE lake.other (id BIGINT)", "INSERT INTO lake.other VALUES (1)")
    lake.execute(MANY.format(0, 300))
    request = _request(lake, lake.execute("SELECT 1"))
    assert DuckLakeKind().layout(request) is not None  # the other table's inlined row
    snap = lake.execute("INSERT INTO lake.r VALUES (1000, 'x')", "DELETE FROM lake.r WHERE id = 5")
    assert len(_lake_rows(lake, snap)) == 300
    assert DuckLakeKind().layout(_request(lake, snap)) is None


def test_a_partitioned_table_is_left_to_a_slice(lake: DuckLakeFixture) -> None:
    snap = lake.execute("ALTER TABLE lake.r SET PARTITIONED BY (region)", MANY.format(0, 300))
    assert DuckLakeKind().layout(_request(lake, snap)) is None


def test_a_merged_file_holding_later_snapshots_rows_is_left_to_a_slice(
    lake: DuckLakeFixture,
) -> None:
    """``ducklake_merge_adjacent_files`` makes one file of several snapshots' inserts; an
    earlier snapshot sees only part of it, which its metadata's row counts do not show."""
    lake.execute(MANY.format(0, 300))
    early = lake.execute(MANY.format(300, 600))
    late = lake.execute(MANY.format(600, 900), "CALL ducklake_merge_adjacent_files('lake')")
    assert len(_lake_rows(lake, early)) == 600
    assert DuckLakeKind().layout(_request(lake, early)) is None
    laid = DuckLakeKind().layout(_request(lake, late))
    assert laid is not None and sum(f.record_count for f in laid.files) == 900
    paths = [f.path.removeprefix("file://") for f in laid.files]
    got = duckdb.connect().execute(f"SELECT id, region FROM read_parquet({paths!r})").fetchall()
    assert sorted(got) == _lake_rows(lake, late)
