"""``planners.iceberg_tx``: an append builds the table's metadata once per staged state (pyiceberg
0.12 deep-copies the whole metadata, every snapshot, on each of ~19 reads per append), and
commits exactly what ``Table.append`` commits."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import update as table_update

from planners import iceberg_tx

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
    real = table_update.update_table_metadata

    def counted(*args, **kwargs):
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(iceberg_tx, "update_table_metadata", counted)
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
