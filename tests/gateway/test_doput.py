"""DoPut into every writable kind: routing, validation, and retries that never duplicate."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import InvalidArgument
from planners.postgres.versioning import enable_versioning, server_now
from tests.gateway.helpers import IcebergFixture
from tests.gateway.kafka_helpers import new_topic

pytestmark = pytest.mark.integration
SCHEMA = [
    {"name": "id", "type": "int64", "nullable": False},
    {"name": "region", "type": "string"},
    {"name": "v", "type": "double"},
]
ARROW = pa.schema([("id", pa.int64()), ("region", pa.string()), ("v", pa.float64())])
REGIONS = ["files", "iceberg", "postgres", "kafka"]


@pytest.fixture
def routed(
    client: HarnessClient,
    tmp_path: Path,
    iceberg: IcebergFixture,
    pg_dsn: str,
    kafka_bootstrap: str,
) -> dict:
    pg = f"put_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{pg}" (id bigint, region text, v double precision)')
        enable_versioning(conn, pg)
        as_of = server_now(conn)
    iceberg.create("put", ARROW)
    topic = new_topic(kafka_bootstrap)
    client.create_table("t", SCHEMA, partition_by=["region"])
    client.commit(
        "t",
        add_sources=[
            {
                "name": "files",
                "kind": "files",
                "partition": {"region": "files"},
                "config": {"root": str(tmp_path / "files")},
                "state": {"files": []},
            },
            {
                "name": "iceberg",
                "kind": "iceberg",
                "partition": {"region": "iceberg"},
                "config": iceberg.source_config("put"),
                "state": {"snapshot_id": None},
            },
            {
                "name": "postgres",
                "kind": "postgres",
                "partition": {"region": "postgres"},
                "config": {"dsn": pg_dsn, "table": pg},
                "state": {"as_of": as_of},
            },
            {
                "name": "kafka",
                "kind": "kafka",
                "partition": {"region": "kafka"},
                "config": {"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0},
                "state": {"low": 0, "high": 0},
            },
        ],
    )
    return {"pg": pg, "pg_dsn": pg_dsn}


def batch(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table(
        {"id": ids, "region": [REGIONS[i % 4] for i in ids], "v": [i / 2 for i in ids]},
        schema=ARROW,
    )


def counts(client: HarnessClient) -> dict[str, int]:
    t = client.read("t", columns=["region"])
    return {r: t.filter(pa.compute.equal(t.column("region"), r)).num_rows for r in REGIONS}


def test_put_routes_to_every_kind_and_repeats_apply_once(
    client: HarnessClient, routed: dict
) -> None:
    before = client.describe("t").version
    res = client.put("t", batch(0, 40), commit_id="upload-1")
    assert res["applied"] and res["rows"] == 40
    assert client.describe("t").version == res["version"] > before
    assert counts(client) == {r: 10 for r in REGIONS}
    again = client.put("t", batch(0, 40), commit_id="upload-1")  # the reply was lost: retry
    assert not again["applied"] and again["version"] == res["version"]
    assert counts(client) == {r: 10 for r in REGIONS}
    client.put("t", batch(40, 8), commit_id="upload-2")
    t = client.read("t").sort_by("id")
    assert t.column("id").to_pylist() == list(range(48)) and t.column("v").to_pylist()[3] == 1.5
    assert len(client.read("t", version=res["version"])) == 40


def test_failure_before_commit_then_retry_never_duplicates(
    gateway, client: HarnessClient, routed: dict
) -> None:
    _, catalog = gateway
    real_commit = catalog.commit
    failures = {"left": 1}

    def flaky_commit(table, commit_id, **kw):  # the gateway dies after writing, before committing
        if commit_id == "upload-x" and failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("simulated crash before the harness commit")
        return real_commit(table, commit_id, **kw)

    real_commit_all = catalog.commit_all

    def flaky_commit_all(table, commits):  # DoPut's versions commit together
        if any(c["commit_id"] == "upload-x" for c in commits) and failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("simulated crash before the harness commit")
        return real_commit_all(table, commits)

    catalog.commit, catalog.commit_all = flaky_commit, flaky_commit_all
    try:
        with pytest.raises(Exception, match="simulated crash"):
            client.put("t", batch(0, 40), commit_id="upload-x")
        assert counts(client) == {r: 0 for r in REGIONS}  # written, but not visible
        res = client.put("t", batch(0, 40), commit_id="upload-x")
    finally:
        catalog.commit, catalog.commit_all = real_commit, real_commit_all
    assert res["applied"]
    assert counts(client) == {r: 10 for r in REGIONS}  # exactly once in every kind
    with psycopg.connect(routed["pg_dsn"]) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{routed["pg"]}"').fetchone() == (10,)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (pa.table({"id": [1], "region": ["files"], "zzz": [1]}), "not in table"),
        (pa.table({"id": ["x"], "region": ["files"]}), "cannot store"),
        (pa.table({"id": pa.array([None], pa.int64()), "region": ["files"]}), "not nullable"),
        (pa.table({"id": [1, 2], "region": ["files", "mars"]}), "route to no writable source"),
    ],
)
def test_bad_uploads_write_nothing(
    client: HarnessClient, routed: dict, data: pa.Table, message: str
) -> None:
    before = client.describe("t")
    with pytest.raises(InvalidArgument, match=message):
        client.put("t", data, commit_id=f"bad-{uuid.uuid4().hex}")
    assert client.describe("t") == before
    assert counts(client) == {r: 0 for r in REGIONS}


def test_put_to_named_source_checks_partition(client: HarnessClient, routed: dict) -> None:
    with pytest.raises(InvalidArgument, match="do not match the partition"):
        client.put("t", batch(0, 4), source="files")
    client.put("t", pa.table({"id": [7], "region": ["files"]}), source="files")
    assert counts(client)["files"] == 1


def test_rows_the_postgres_table_refuses_are_the_callers_error(
    client: HarnessClient, routed: dict
) -> None:
    """A key already in the table, or a value its CHECK refuses, failed the DoPut as INTERNAL
    (psycopg's UniqueViolation, logged as a gateway bug, and counted under a metric status of
    its own type name); now ALREADY_EXISTS and INVALID_ARGUMENT, nothing committed."""
    from flight_gateway.core.metrics import status_of
    from flight_gateway.protocol.errors import AlreadyExists

    with psycopg.connect(routed["pg_dsn"], autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{routed["pg"]}" ADD PRIMARY KEY (id)')
        conn.execute(f'ALTER TABLE "{routed["pg"]}" ADD CHECK (v >= 0)')
    row = pa.table({"id": [2], "region": ["postgres"], "v": [1.0]}, schema=ARROW)
    client.put("t", row, source="postgres")
    before = client.describe("t")
    with pytest.raises(AlreadyExists, match=r"Key \(id\)=\(2\) already exists"):
        client.put("t", row, source="postgres", commit_id=f"again-{uuid.uuid4().hex}")
    # the region's value is checked against, and never quoted back (the server's detail for
    # a CHECK is the whole failing row)
    negative = pa.table({"id": [6], "region": ["postgres"], "v": [-1.0]}, schema=ARROW)
    with pytest.raises(InvalidArgument, match="check constraint") as refused:
        client.put("t", negative, source="postgres")
    assert "-1" not in str(refused.value) and "Failing row" not in str(refused.value)
    assert client.describe("t") == before
    assert counts(client)["postgres"] == 1
    assert status_of(psycopg.errors.UniqueViolation("x")) == "INTERNAL"  # a bug's label
