"""NaN under NOT: ``NOT (x > 1)`` is TRUE for NaN (NaN > 1 is FALSE, as in pyarrow and the
residual filter), so every path must return the NaN rows it matches. Parquet and Iceberg
min/max statistics leave NaN out, so pruning by them must not drop those rows."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest

from clients import HarnessClient
from tests.gateway.helpers import IcebergFixture, client_for, running_gateway, write_parquet

pytestmark = pytest.mark.integration

NAN = float("nan")
ARROW = pa.schema([("id", pa.int64()), ("x", pa.float64()), ("y", pa.int32())])
# One Iceberg data file (and one Parquet file) each; no group holds a NULL next to its NaN,
# so the statistics of x cover only its other values.
GROUPS = [
    [(0, NAN, 0), (1, 2.0, 0)],
    [(2, NAN, 1), (3, 0.5, 1)],
    [(4, NAN, 0)],
    [(5, None, 0), (6, 1.0, 1)],
    [(7, NAN, 1), (8, 1.0, 0), (9, 1.0, 1)],
]
ALL_BUT_NULL = [0, 1, 2, 3, 4, 6, 7, 8, 9]
CASES = [
    ("NOT (x > 1)", [0, 2, 3, 4, 6, 7, 8, 9]),
    ("NOT (x < 1)", [0, 1, 2, 4, 6, 7, 8, 9]),
    ("NOT (x >= 1)", [0, 2, 3, 4, 7]),
    ("NOT (x <= 1)", [0, 1, 2, 4, 7]),
    ("NOT (x = 1)", [0, 1, 2, 3, 4, 7]),
    ("x != 1", [0, 1, 2, 3, 4, 7]),
    ("NOT (x IN (1, 2))", [0, 2, 3, 4, 7]),
    ("NOT (x BETWEEN 0 AND 1)", [0, 1, 2, 4, 7]),
    ("NOT (x < 1 AND y = 0)", ALL_BUT_NULL),
    ("NOT (x > 1 OR y = 5)", [0, 2, 3, 4, 6, 7, 8, 9]),
    ("NOT (NOT (x > 1))", [1]),
    ("NOT (x IS NULL)", ALL_BUT_NULL),
    ("x > 1", [1]),
    ("x <= 1", [3, 6, 8, 9]),
]


def _table(rows: list[tuple]) -> pa.Table:
    return pa.table({c: [r[i] for r in rows] for i, c in enumerate(ARROW.names)}, schema=ARROW)


@pytest.fixture(scope="module")
def nan_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HarnessClient]:
    """Tables ``ice`` (an Iceberg source), ``files`` (Parquet files) and ``delta`` (a Delta
    table, one file per group) with the same rows."""
    from deltalake import write_deltalake

    root = tmp_path_factory.mktemp("nan")
    iceberg = IcebergFixture(root / "ice")
    table = iceberg.create("t", ARROW)
    for i, rows in enumerate(GROUPS):
        table.append(_table(rows))
        write_parquet(root / "files" / f"{i}.parquet", _table(rows))
        write_deltalake(str(root / "delta"), _table(rows), mode="append")
    schema = [{"name": f.name, "type": str(f.type)} for f in ARROW]
    with running_gateway(f"sqlite:///{root / 'catalog.db'}") as (server, _):
        client = client_for(server)
        client.create_table("ice", schema)
        client.add_source(
            "ice",
            "ice",
            "iceberg",
            config={**iceberg.source_config("t"), "direct": True},
            state={"snapshot_id": table.current_snapshot().snapshot_id},
        )
        client.create_table("files", schema)
        client.add_source(
            "files",
            "files",
            "files",
            config={"root": str(root / "files"), "direct": True},
            state={"files": [f"{i}.parquet" for i in range(len(GROUPS))]},
        )
        client.create_table("delta", schema)
        client.add_source(
            "delta",
            "delta",
            "delta",
            config={"uri": str(root / "delta"), "target_task_bytes": 1},
            state={"version": len(GROUPS) - 1},
        )
        yield client
        client.close()


@pytest.mark.parametrize("direct", [False, True], ids=["flight", "direct"])
@pytest.mark.parametrize("table", ["ice", "files", "delta"])
@pytest.mark.parametrize(("flt", "want"), CASES, ids=[c[0] for c in CASES])
def test_nan_rows_survive_not_filters(
    nan_client: HarnessClient, table: str, direct: bool, flt: str, want: list[int]
) -> None:
    got = nan_client.read(table, columns=["id"], filter=flt, direct=direct).column("id")
    assert sorted(got.to_pylist()) == want, flt
