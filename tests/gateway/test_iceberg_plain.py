"""Iceberg data files read as plain Parquet datasets by field id (``planners.iceberg_plain``):
the rows are pyiceberg's own at the same snapshot, through a schema that evolved (a type
promoted, a column added, one renamed, one dropped and added again under its old name, files
without field ids added by name)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import planners.iceberg as iceberg_kind
from clients import HarnessClient
from tests.gateway.helpers import IcebergFixture

SCHEMA = [
    {"name": "id", "type": "int64"},
    {"name": "n", "type": "int64"},
    {"name": "name", "type": "string"},
    {"name": "score", "type": "float64"},
    {"name": "extra", "type": "string"},
    {"name": "elsewhere", "type": "int32"},  # not in the Iceberg table: nulls
]


def _rows(table: Any, first: int, n: int) -> pa.Table:
    """``n`` rows for the table's current schema, ids from ``first``."""
    ids = list(range(first, first + n))
    values = {
        "id": ids,
        "n": [i % 11 for i in ids],
        "name": [f"name{i}" for i in ids],
        "points": [i / 4 for i in ids],
        "score": [i / 4 for i in ids],
        "extra": [None if i % 3 else f"x{i}" for i in ids],
    }
    schema = table.schema().as_arrow()
    return pa.table({f.name: pa.array(values[f.name], f.type) for f in schema}, schema=schema)


def _append(table: Any, first: int, files: int) -> int:
    for _ in range(files):
        table.append(_rows(table, first, 25))
        first += 25
    return first


@pytest.fixture
def evolved(client: HarnessClient, iceberg: IcebergFixture) -> Any:
    from pyiceberg.types import LongType, StringType

    arrow = pa.schema([
        pa.field("id", pa.int64(), nullable=False), ("n", pa.int32()), ("name", pa.string()),
        ("points", pa.float64()),
    ])  # fmt: skip
    table = iceberg.create("evolved", arrow)
    first = _append(table, 0, 4)
    with table.update_schema() as update:
        update.update_column("n", LongType())
        update.add_column("extra", StringType())
    first = _append(table, first, 3)
    with table.update_schema() as update:
        update.rename_column("points", "score")
    first = _append(table, first, 3)
    with table.update_schema() as update:
        update.delete_column("name")
    with table.update_schema() as update:
        update.add_column("name", StringType())  # a new field id under the old name
    first = _append(table, first, 3)
    # Files without field ids, as engines write them, added by name (the table's name mapping).
    for i in range(2):
        path = f"{iceberg.root}/added-{i}.parquet"
        rows = _rows(table, first, 25)
        plain = pa.schema([pa.field(f.name, f.type, f.nullable) for f in rows.schema])
        pq.write_table(rows.cast(plain), path)
        table.add_files([path])
        first += 25
    client.create_table("t", SCHEMA)
    client.commit("t", add_sources=[{
        "name": "ice", "kind": "iceberg", "config": iceberg.source_config("evolved"),
        "state": {"snapshot_id": table.current_snapshot().snapshot_id},
    }])  # fmt: skip
    return table


@pytest.fixture
def plain_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """Whether each Iceberg read in the gateway went the plain way."""
    served: list[bool] = []
    real = iceberg_kind.plain_read

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        served.append(out is not None)
        return out

    monkeypatch.setattr(iceberg_kind, "plain_read", spy)
    yield served


def _pyiceberg(table: Any, columns: list[str], row_filter: str = "True") -> list[dict]:
    got = table.scan(row_filter=row_filter, selected_fields=("id", *columns)).to_arrow()
    got = got.cast(pa.schema([pa.field(f.name, f.type) for f in got.schema]))
    out = got.sort_by("id").to_pylist()
    return [{k: r[k] for k in ("id", *columns)} for r in out]


def _harness(client: HarnessClient, columns: list[str], where: str | None = None) -> list[dict]:
    return client.read("t", columns=["id", *columns], filter=where).sort_by("id").to_pylist()


@pytest.mark.parametrize(
    ("columns", "where", "iceberg_filter", "plain"),
    [
        (["n"], None, "True", True),
        (["n", "extra"], "n > 5", "n > 5", True),
        (["extra"], "extra IS NULL", "extra IS NULL", True),
        (["score"], None, "True", False),  # renamed since the first files: pyiceberg reads
        (["name", "n"], "id >= 200", "id >= 200", False),  # dropped and added again: pyiceberg
    ],
)
def test_rows_are_pyicebergs(
    client: HarnessClient, evolved: Any, plain_reads: list[bool],
    columns: list[str], where: str | None, iceberg_filter: str, plain: bool,
) -> None:  # fmt: skip
    want = _pyiceberg(evolved, columns, iceberg_filter)
    assert want
    assert _harness(client, columns, where) == want
    assert plain_reads and set(plain_reads) == {plain}


def test_a_projection_of_only_unselected_columns_counts_rows(
    client: HarnessClient, evolved: Any
) -> None:
    """Harness columns the Iceberg table lacks are nulls, one per row pyiceberg reads."""
    got = client.read("t", columns=["elsewhere"])
    assert got.num_rows == evolved.scan().to_arrow().num_rows
    assert got.column("elsewhere").null_count == got.num_rows
