"""Upserts and deletes through DoPut (``mode: merge``): into an Iceberg source they land as
data plus equality delete files in one snapshot and one harness commit, into a versioned
Postgres source as upsert/delete statements; a key updated five times in one upload appears
once with its last value, a deleted key is gone, a retry applies nothing twice. DuckDB's
iceberg extension reads the Iceberg table the same way."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import InvalidArgument
from planners.postgres.versioning import enable_versioning, server_now
from tests.gateway.helpers import IcebergFixture

pytestmark = pytest.mark.integration
ARROW = pa.schema(
    [pa.field("id", pa.int64(), nullable=False), ("region", pa.string()), ("v", pa.int64())]
)
SCHEMA = [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in ARROW]


@pytest.fixture(scope="module")
def duck() -> Iterator[Any]:
    from tests.planners.test_iceberg_deletes import duck as make

    yield from make.__wrapped__()  # type: ignore[attr-defined]


@pytest.fixture
def merged(client: HarnessClient, tmp_path: Path, pg_dsn: str) -> dict[str, Any]:
    iceberg = IcebergFixture(tmp_path)
    ice = iceberg.catalog.create_table("db.up", schema=ARROW, properties={"format-version": "2"})
    pg = f"up_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{pg}" (id bigint PRIMARY KEY, region text, v bigint)')
        enable_versioning(conn, pg)
        as_of = server_now(conn)
    client.create_table("t", SCHEMA, partition_by=["region"], primary_key=["id"])
    client.commit(
        "t",
        add_sources=[
            {
                "name": "ice",
                "kind": "iceberg",
                "partition": {"region": "ice"},
                "config": iceberg.source_config("up"),
                "state": {"snapshot_id": None},
            },
            {
                "name": "pg",
                "kind": "postgres",
                "partition": {"region": "pg"},
                "config": {"dsn": pg_dsn, "table": pg},
                "state": {"as_of": as_of},
            },
        ],
    )
    return {"iceberg": ice}


def upload(rows: list[tuple[int, str, int | None, str]]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "region": [r[1] for r in rows],
            "v": pa.array([r[2] for r in rows], pa.int64()),
            "_op": [r[3] for r in rows],
        }
    )


def state(client: HarnessClient, **kw: Any) -> dict[int, tuple[str, int]]:
    t = client.read("t", **kw).to_pylist()
    assert len(t) == len({r["id"] for r in t}), "a key appears twice"
    return {r["id"]: (r["region"], r["v"]) for r in t}


def test_last_operation_per_key_wins_in_every_kind(
    client: HarnessClient, merged: dict[str, Any], duck: Any
) -> None:
    first = [
        (i, region, i, "upsert")
        for region in ("ice", "pg")
        for i in range(10 * (region == "pg"), 10 * (region == "pg") + 5)
    ]
    client.put("t", upload(first), merge=True)
    v1 = client.describe("t").version
    # key 1 (ice) and 11 (pg) updated five times, 2 and 12 deleted, 3 deleted then re-upserted
    batch = []
    for base, region in ((0, "ice"), (10, "pg")):
        batch += [(base + 1, region, 100 + n, "upsert") for n in range(5)]
        batch += [(base + 2, region, None, "delete"), (base + 3, region, None, "delete")]
        batch += [(base + 3, region, 33, "upsert"), (base + 7, region, 7, "upsert")]
    res = client.put("t", upload(batch), merge=True, commit_id="merge-2")
    want = {}
    for base, region in ((0, "ice"), (10, "pg")):
        want.update({base + 0: (region, base), base + 1: (region, 104), base + 3: (region, 33)})
        want.update({base + 4: (region, base + 4), base + 7: (region, 7)})
    assert state(client) == want
    assert state(client, version=v1) == {r[0]: (r[1], r[2]) for r in first}  # pinned: unchanged
    again = client.put("t", upload(batch), merge=True, commit_id="merge-2")
    assert (again["applied"], again["version"]) == (False, res["version"])
    assert state(client) == want
    ice = merged["iceberg"]
    ice.refresh()
    rows = duck.execute(
        f"SELECT id, v FROM iceberg_scan('{ice.metadata_location}') ORDER BY id"
    ).fetchall()
    assert rows == sorted((k, v[1]) for k, v in want.items() if v[0] == "ice")


def test_bad_merges_are_refused_and_write_nothing(
    client: HarnessClient, merged: dict[str, Any], tmp_path: Path
) -> None:
    version = client.describe("t").version
    with pytest.raises(InvalidArgument, match="'upsert' or 'delete'"):
        client.put("t", upload([(1, "ice", 1, "insert")]), merge=True)
    with pytest.raises(InvalidArgument, match="id"):
        bad = upload([(1, "ice", 1, "upsert")]).set_column(0, "id", pa.array([None], pa.int64()))
        client.put("t", bad, merge=True)
    client.create_table("plain", [{"name": "id", "type": "int64"}])
    with pytest.raises(InvalidArgument, match="primary_key"):
        client.put("plain", pa.table({"id": [1]}), merge=True)
    client.create_table("files", [{"name": "id", "type": "int64"}], primary_key=["id"])
    client.add_source(
        "files", "f", "files", config={"root": str(tmp_path / "f")}, state={"files": []}
    )
    with pytest.raises(InvalidArgument, match="does not take upserts"):
        client.put("files", pa.table({"id": [1]}), merge=True)
    assert client.describe("t").version == version
