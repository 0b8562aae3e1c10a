"""A DuckLake snapshot as its data files in place (DESIGN §16) only when those files are exactly
its rows; every other snapshot is left to a slice. DuckDB's own DuckLake read is the oracle."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from planners import ducklake_files
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


def _oracle_files(lake: DuckLakeFixture, table: str, schema: str, snap: int) -> list[tuple]:
    con = connect(lake.config)
    try:
        return con.execute(
            "SELECT data_file, data_file_size_bytes, delete_file FROM ducklake_list_files("
            "'lake', ?, schema => ?, snapshot_version => ?) ORDER BY data_file",
            [table, schema, snap],
        ).fetchall()
    finally:
        con.close()


def test_files_are_listed_as_ducklake_lists_them(lake: DuckLakeFixture, tmp_path: Path) -> None:
    """The metadata's files (``ducklake_files.listed``) against ``ducklake_list_files`` at
    every snapshot: files the lake wrote (relative paths), files merged, a delete file, a file
    added from outside the data path (an absolute path), another schema, a table dropped."""
    outside = tmp_path / "outside.parquet"
    duckdb.connect().execute(
        f"COPY (SELECT range AS id, 'o' || range AS region FROM range(50)) TO '{outside}'"
    )
    snaps = [
        lake.execute(MANY.format(0, 300)),
        lake.execute(MANY.format(300, 600)),
        lake.execute("CALL ducklake_merge_adjacent_files('lake')"),
        lake.execute(MANY.format(600, 900), "DELETE FROM lake.r WHERE id < 200"),
        lake.execute(f"CALL ducklake_add_data_files('lake', 'r', '{outside}')"),
        lake.execute("CREATE SCHEMA lake.s", "CREATE TABLE lake.s.r AS SELECT * FROM lake.r"),
        lake.execute("DROP TABLE lake.s.r"),
    ]
    con = connect(lake.config)
    seen, deletes, added = 0, 0, 0
    try:
        for snap in snaps:
            for schema in ("main", "s"):
                table = ducklake_files.table_id(con, {"table": "r", "schema": schema}, snap)
                if table is None:
                    continue
                got = ducklake_files.listed(con, table, snap)
                assert got == _oracle_files(lake, "r", schema, snap)
                seen += len(got)
                deletes += sum(1 for _, _, d in got if d)
                added += sum(1 for p, _, _ in got if p == str(outside))
    finally:
        con.close()
    assert seen > 10 and deletes and added  # each shape was met


TYPES = [
    "BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER",
    "UBIGINT", "HUGEINT", "FLOAT", "DOUBLE", "DECIMAL(4,1)", "DECIMAL(9,3)", "DECIMAL(18,2)",
    "DECIMAL(38,10)", "DATE", "TIME", "TIMESTAMP", "TIMESTAMPTZ", "TIMESTAMP_S", "TIMESTAMP_MS",
    "TIMESTAMP_NS", "INTERVAL", "VARCHAR", "BLOB", "UUID", "JSON", "INTEGER[]",
    "STRUCT(a INTEGER)", "MAP(VARCHAR, INTEGER)", "TIMETZ",
]  # fmt: skip


def test_column_types_read_from_the_metadata_are_duckdbs(lake: DuckLakeFixture) -> None:
    """Each DuckLake type ``ducklake_files`` types from the metadata is the Arrow type
    DuckDB reads it as (the others are left to DuckDB), and a layout's columns are typed as
    DuckDB types them either way."""
    cols = ", ".join(f'"c{i}" {t}' for i, t in enumerate(TYPES))
    snap = lake.execute(
        f"CREATE TABLE lake.t ({cols})", "CREATE TABLE lake.k (id BIGINT, p DECIMAL(7,2))"
    )
    con = connect(lake.config)
    try:
        for table in ("t", "k"):
            at = f"lake.main.{table} AT (VERSION => {snap})"
            duck = con.execute(f"SELECT * FROM {at} LIMIT 0").arrow().schema
            found = ducklake_files.table_id(con, {"table": table}, snap)
            assert found is not None
            meta, _ = ducklake_files.columns(con, found, snap)
            assert [name for name, _, _ in meta] == duck.names
            known = [ducklake_files.arrow_type(t) for _, _, t in meta]
            for field, typed in zip(duck, known, strict=True):
                assert typed is None or typed == field.type, field
            assert ducklake_files._schema(con, at, meta) == duck
    finally:
        con.close()
    assert sum(t is not None for t in known) == 2  # the table k was typed from the metadata
