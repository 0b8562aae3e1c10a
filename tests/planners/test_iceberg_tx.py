"""``planners.iceberg_tx``: an append builds the table's metadata once per staged state (pyiceberg
0.12 deep-copies the whole metadata, every snapshot, on each of ~19 reads per append), and
commits exactly what ``Table.append`` commits; a catalog staging its commits without the deep
copy and reading each metadata file once writes what DuckDB's iceberg extension and a fresh
parse read back."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from planners import iceberg_tx
from tests.planners.test_iceberg_deletes import duck  # noqa: F401 (a fixture)

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("region", pa.string())])


def _rows(first: int, n: int = 10) -> pa.Table:
    return pa.table({"id": range(first, first + n), "region": ["r"] * n}, schema=SCHEMA)


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    (tmp_path / "wh").mkdir()
    cat = SqlCatalog(
        "default", uri=f"sqlite:///{tmp_path / 'ice.db'}", warehouse=f"file://{tmp_path / 'wh'}"
    )
    cat.create_namespace("db")
    return cat


def test_an_append_builds_its_metadata_once_per_staged_state(catalog, monkeypatch) -> None:
    table = catalog.create_table("db.t", schema=SCHEMA)
    for i in range(5):
        table.append(_rows(i * 10))
    built: list[int] = []
    real = iceberg_tx.updated_metadata

    def counted(*args, **kwargs):
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(iceberg_tx, "updated_metadata", counted)
    iceberg_tx.append(catalog.load_table("db.t"), _rows(50), {"harness.commit-id": "c1"})
    # One state staged (the snapshot and its branch); pyiceberg's own Transaction built it on
    # every read of ``table_metadata`` (19 here).
    assert len(built) == 1


def test_an_append_commits_what_pyicebergs_append_commits(catalog) -> None:
    ours = catalog.create_table("db.ours", schema=SCHEMA)
    theirs = catalog.create_table("db.theirs", schema=SCHEMA)
    for i in range(3):
        props = {"harness.commit-id": f"c{i}"}
        iceberg_tx.append(ours, _rows(i * 10), props)
        theirs.append(_rows(i * 10), snapshot_properties=props)
    ours, theirs = catalog.load_table("db.ours"), catalog.load_table("db.theirs")
    assert ours.scan().to_arrow().sort_by("id") == theirs.scan().to_arrow().sort_by("id")
    for a, b in zip(ours.snapshots(), theirs.snapshots(), strict=True):
        assert a.summary == b.summary
        assert a.sequence_number == b.sequence_number
    assert ours.current_snapshot().summary["harness.commit-id"] == "c2"


def test_a_shared_catalog_writes_what_is_read_back(catalog, duck) -> None:  # noqa: F811
    """Appends, a delete, a new column and more appends through a catalog that stages its
    commits without deep copies (``share_metadata``): each metadata file parsed afresh equals
    what the table holds, and DuckDB reads the rows pyiceberg reads."""
    iceberg_tx.share_metadata(catalog)
    table = catalog.create_table("db.shared", schema=SCHEMA)
    for i in range(6):
        iceberg_tx.append(catalog.load_table("db.shared"), _rows(i * 10), {"c": str(i)})
    table = catalog.load_table("db.shared")
    with iceberg_tx.transaction(table) as tx:
        tx.delete("id < 15")
    with catalog.load_table("db.shared").update_schema() as update:
        update.add_column("extra", pa_type_long())
    wider = pa.schema([*SCHEMA, pa.field("extra", pa.int64())])
    iceberg_tx.append(
        catalog.load_table("db.shared"),
        pa.table({"id": [100], "region": ["x"], "extra": [7]}, schema=wider),
        {"c": "last"},
    )
    table = catalog.load_table("db.shared")
    fresh = iceberg_tx._parse(table.io.new_input(table.metadata_location))
    assert fresh == table.metadata
    assert table.current_snapshot().summary["c"] == "last"
    assert len(table.metadata.metadata_log) >= len(table.metadata.snapshots) >= 8
    ours = table.scan().to_arrow().sort_by("id").to_pylist()
    assert [r["id"] for r in ours] == [15, *range(16, 60), 100]
    theirs = duck.execute(
        f"SELECT * FROM iceberg_scan('{table.metadata_location}') ORDER BY id"
    ).to_arrow_table()
    assert theirs.to_pylist() == ours


def test_a_metadata_file_is_parsed_once(catalog) -> None:
    iceberg_tx.keep_metadata_parsed()
    table = catalog.create_table("db.once", schema=SCHEMA)
    iceberg_tx.append(table, _rows(0), {"c": "0"})
    first, again = catalog.load_table("db.once"), catalog.load_table("db.once")
    assert first.metadata is again.metadata  # one parse for one file
    iceberg_tx.append(first, _rows(10), {"c": "1"})
    after = catalog.load_table("db.once")
    assert after.metadata is not first.metadata and len(after.metadata.snapshots) == 2


def pa_type_long():  # type: ignore[no-untyped-def]
    from pyiceberg.types import LongType

    return LongType()


def test_parsed_metadata_is_bounded_by_its_entries(catalog, monkeypatch) -> None:
    iceberg_tx.keep_metadata_parsed()
    monkeypatch.setattr(iceberg_tx, "PARSED_ENTRIES", 4)
    table = catalog.create_table("db.bounded", schema=SCHEMA)
    for i in range(4):
        iceberg_tx.append(catalog.load_table("db.bounded"), _rows(i * 10), {"c": str(i)})
    # The latest file (4 snapshots, their log entries) outweighs the bound alone: it stays,
    # every older one went.
    latest = catalog.load_table("db.bounded").metadata_location
    assert list(iceberg_tx._PARSED) == [latest]
    assert table.metadata_location not in iceberg_tx._PARSED


def test_a_commit_leaves_its_metadata_parsed(catalog, monkeypatch) -> None:
    """The next load after a commit (the next writer's, a read's plan) parses no file: the
    commit's own staged metadata is what it wrote, equal to that file parsed afresh."""
    iceberg_tx.share_metadata(catalog)
    table = catalog.create_table("db.seeded", schema=SCHEMA)
    iceberg_tx.append(catalog.load_table("db.seeded"), _rows(0), {"c": "0"})
    parses: list[str] = []
    real = iceberg_tx._parse

    def counted(input_file, encoding="utf-8"):  # type: ignore[no-untyped-def]
        parses.append(str(input_file.location))
        return real(input_file, encoding)

    monkeypatch.setattr(iceberg_tx, "_parse", counted)
    for i in range(1, 4):
        iceberg_tx.append(catalog.load_table("db.seeded"), _rows(i * 10), {"c": str(i)})
    table = catalog.load_table("db.seeded")
    assert parses == []
    assert len(table.metadata.snapshots) == 4
    assert real(table.io.new_input(table.metadata_location)) == table.metadata
    assert [r["id"] for r in table.scan().to_arrow().sort_by("id").to_pylist()] == list(range(40))


def test_files_prepared_for_one_table_never_fit_another(catalog) -> None:
    """Two new tables of one schema share schema and spec ids (0, 0): files written for one
    live under its location and must not be committed to the other."""
    first = catalog.create_table("db.first", schema=SCHEMA)
    second = catalog.create_table("db.second", schema=SCHEMA)
    prepared = iceberg_tx.write_data_files(first, _rows(0))
    assert iceberg_tx.fits(first, prepared) and not iceberg_tx.fits(second, prepared)
    iceberg_tx.append_files(first, prepared, {"c": "0"})
    assert prepared.used
    assert [r["id"] for r in catalog.load_table("db.first").scan().to_arrow().to_pylist()] == list(
        range(10)
    )
