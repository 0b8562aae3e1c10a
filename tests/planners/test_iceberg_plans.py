"""An Iceberg snapshot is loaded and planned once per pinned filter, whatever columns a request
selects (Flight SQL plans each statement's column set of a table: each used to reload the
table's metadata and re-read its manifest list). pyiceberg's own read is the oracle."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from planners import iceberg
from planners.kind import ColumnSpec, ScanRequest, SourceRef
from planners.predicates.parse import parse_filter
from tests.gateway.helpers import IcebergFixture

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])
SPECS = {"id": ColumnSpec(1, "id", "int64"), "v": ColumnSpec(2, "v", "string")}


def _request(config: dict, snap: int, cols: tuple[str, ...], where: str | None) -> ScanRequest:
    source = SourceRef("ice", "iceberg", config, {}, {"snapshot_id": snap})
    predicate = parse_filter(where, SCHEMA) if where else None
    return ScanRequest(source, tuple(SPECS[c] for c in cols), predicate)


def _read(kind: iceberg.IcebergKind, request: ScanRequest) -> pa.Table:
    batches = [b for t in kind.plan(request) for b in kind.read(request, t)]
    names = [c.name for c in request.columns]
    return pa.Table.from_batches(batches).select(names) if batches else pa.table({})


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"load": 0, "plan": 0}
    load, plan = iceberg.load_table, iceberg.plan_with_deletes

    def counted_load(*a, **k):  # type: ignore[no-untyped-def]
        calls["load"] += 1
        return load(*a, **k)

    def counted_plan(*a, **k):  # type: ignore[no-untyped-def]
        calls["plan"] += 1
        return plan(*a, **k)

    monkeypatch.setattr(iceberg, "load_table", counted_load)
    monkeypatch.setattr(iceberg, "plan_with_deletes", counted_plan)
    return calls


def test_column_sets_of_a_snapshot_share_its_load_and_plan(
    tmp_path: Path, counted: dict[str, int]
) -> None:
    fixture = IcebergFixture(tmp_path)
    table = fixture.create("t", SCHEMA)
    for i in range(4):
        table.append(pa.table({"id": pa.array(range(i * 10, i * 10 + 10), pa.int64()),
                               "v": [f"r{i}"] * 10}))  # fmt: skip
    table = fixture.catalog.load_table("db.t")
    snap = table.current_snapshot().snapshot_id
    kind, config = iceberg.IcebergKind(), fixture.source_config("t")
    for cols in [("id",), ("v",), ("id", "v")]:
        got = _read(kind, _request(config, snap, cols, None))
        want = table.scan(snapshot_id=snap, selected_fields=cols).to_arrow().select(list(cols))
        assert got.sort_by(cols[0]).equals(want.sort_by(cols[0]))
    assert counted == {"load": 1, "plan": 1}
    where = "id >= 25"
    for cols in [("id",), ("id", "v")]:
        request = _request(config, snap, cols, where)
        assert sum(len(t.payload["files"]) for t in kind.plan(request)) == 2  # pruned
        assert sorted(_read(kind, request).column("id").to_pylist()) == list(range(25, 40))
    assert counted == {"load": 1, "plan": 2}  # one more plan: the filter prunes files
    older = table.snapshots()[0].snapshot_id
    assert _read(kind, _request(config, older, ("id",), None)).num_rows == 10
    assert counted == {"load": 2, "plan": 3}
