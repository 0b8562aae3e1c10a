"""Iceberg snapshot expiry below the harness's pins is optimistic (DESIGN §18): a writer that
commits while the expiry commits (between the catalog's read of the table and its
compare-and-set: a real pyiceberg SqlCatalog) makes the catalog refuse it; the expiry reads the
table again and succeeds, keeping the writer's snapshot. CI saw maintenance fail on exactly this
race with a mover appending to the table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from planners import iceberg
from tests.gateway.helpers import IcebergFixture

SCHEMA = pa.schema([("id", pa.int64())])


def _race(monkeypatch: pytest.MonkeyPatch, table: Any, times: int) -> list[int]:
    """The next ``times`` metadata writes of any commit first let a writer append a row."""
    write = SqlCatalog._write_metadata
    appended: list[int] = []

    def racing(*args: Any, **kwargs: Any) -> Any:
        if len(appended) < times and not getattr(racing, "inside", False):
            racing.inside = True  # type: ignore[attr-defined]
            try:
                table.append(pa.table({"id": [100 + len(appended)]}, schema=SCHEMA))
                appended.append(table.current_snapshot().snapshot_id)
            finally:
                racing.inside = False  # type: ignore[attr-defined]
        return write(*args, **kwargs)

    monkeypatch.setattr(SqlCatalog, "_write_metadata", staticmethod(racing))
    return appended


def _table(tmp_path: Path) -> tuple[Any, dict[str, Any], list[int]]:
    ice = IcebergFixture(tmp_path)
    table = ice.create("cold", SCHEMA)
    for i in range(3):
        table.append(pa.table({"id": [i]}, schema=SCHEMA))
    return table, ice.source_config("cold"), [s.snapshot_id for s in table.metadata.snapshots]


def test_an_expiry_that_loses_the_table_to_a_writer_reads_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, config, snaps = _table(tmp_path)
    writers = _race(monkeypatch, table, times=1)
    assert iceberg.expire_below_pins(config, {snaps[2]}) == 2
    assert len(writers) == 1
    left = [s.snapshot_id for s in iceberg.load_table(config).metadata.snapshots]
    assert left == [snaps[2], *writers]
    rows = iceberg.load_table(config).scan().to_arrow().column("id").to_pylist()
    assert sorted(rows) == [0, 1, 2, 100]


def test_an_expiry_that_keeps_losing_is_left_to_the_next_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, config, snaps = _table(tmp_path)
    monkeypatch.setattr(iceberg.time, "sleep", lambda s: None)
    writers = _race(monkeypatch, table, times=iceberg.EXPIRE_TRIES)
    assert iceberg.expire_below_pins(config, {snaps[2]}) == 0
    assert len(writers) == iceberg.EXPIRE_TRIES
    left = [s.snapshot_id for s in iceberg.load_table(config).metadata.snapshots]
    assert left == [*snaps, *writers]  # nothing expired, nothing lost
