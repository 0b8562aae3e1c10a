"""Atomic schema evolution across Kafka, Postgres, Iceberg and DuckLake at once."""

from __future__ import annotations

import uuid

import psycopg
import pyarrow as pa
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import Unavailable
from planners.postgres.versioning import enable_versioning, server_now
from tests.gateway.helpers import DuckLakeFixture, IcebergFixture
from tests.gateway.kafka_helpers import json_values, new_topic, produce

pytestmark = pytest.mark.integration
SCHEMA = [
    {"name": "id", "type": "int64"},
    {"name": "n", "type": "int32"},
    {"name": "name", "type": "string"},
]
ARROW = pa.schema([("id", pa.int64()), ("n", pa.int32()), ("name", pa.string())])


@pytest.fixture
def four_kinds(
    client: HarnessClient,
    kafka_bootstrap: str,
    pg_dsn: str,
    iceberg: IcebergFixture,
    ducklake: DuckLakeFixture,
) -> dict:
    topic = new_topic(kafka_bootstrap)
    produce(
        kafka_bootstrap, topic, json_values([{"id": i, "n": i, "name": f"k{i}"} for i in range(3)])
    )
    pg = f"ev_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{pg}" (id bigint PRIMARY KEY, n integer, name text)')
        enable_versioning(conn, pg)
        conn.execute(f"INSERT INTO \"{pg}\" VALUES (10, 10, 'p10'), (11, 11, 'p11')")
        as_of = server_now(conn)
    ice = iceberg.create("ev", ARROW)
    ice.append(pa.table({"id": [20], "n": [20], "name": ["i20"]}, schema=ARROW))
    lake_snap = ducklake.execute(
        "CREATE TABLE lake.ev (id BIGINT, n INTEGER, name VARCHAR)",
        "INSERT INTO lake.ev VALUES (30, 30, 'd30')",
    )
    client.create_table("t", SCHEMA)
    v = client.commit(
        "t",
        add_sources=[
            {
                "name": "kafka",
                "kind": "kafka",
                "config": {"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0},
                "state": {"low": 0, "high": 3},
            },
            {
                "name": "pg",
                "kind": "postgres",
                "config": {"dsn": pg_dsn, "table": pg},
                "state": {"as_of": as_of},
            },
            {
                "name": "ice",
                "kind": "iceberg",
                "config": iceberg.source_config("ev"),
                "state": {"snapshot_id": ice.current_snapshot().snapshot_id},
            },
            {
                "name": "lake",
                "kind": "ducklake",
                "config": ducklake.source_config("ev"),
                "state": {"snapshot_id": lake_snap},
            },
        ],
    )
    return {"version": v, "topic": topic, "pg": pg, "ice": ice}


def test_evolution_applies_everywhere_and_old_pins_keep_old_schema(
    client: HarnessClient,
    four_kinds: dict,
    kafka_bootstrap: str,
    pg_dsn: str,
    ducklake: DuckLakeFixture,
) -> None:
    before = client.read("t", version=four_kinds["version"]).sort_by("id")
    v_new = client.evolve_schema(
        "t",
        [
            {"op": "add_column", "name": "extra", "type": "string"},
            {"op": "widen_type", "name": "n", "type": "int64"},
            {"op": "rename_column", "name": "name", "new_name": "title"},
        ],
    )
    new = client.read("t").sort_by("id")
    assert (
        new.schema.names == ["id", "n", "title", "extra"]
        and new.schema.field("n").type == pa.int64()
    )
    assert new.column("title").to_pylist() == ["k0", "k1", "k2", "p10", "p11", "i20", "d30"]
    assert new.column("extra").null_count == 7
    old = client.read("t", version=four_kinds["version"]).sort_by("id")
    assert old.schema == before.schema and old.equals(before)
    # The additive part reached every source with a schema of its own.
    pg = four_kinds["pg"]
    with psycopg.connect(pg_dsn) as conn:
        for t in (pg, f"{pg}_history"):
            cols = dict(
                conn.execute(
                    "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
                    (t,),
                ).fetchall()
            )
            assert cols["extra"] == "text" and cols["n"] == "bigint" and "name" in cols
    ice = four_kinds["ice"]
    ice.refresh()
    assert {f.name: str(f.field_type) for f in ice.schema().fields}[
        "n"
    ] == "long" and "extra" in ice.schema().column_names
    # Writers now write the new column everywhere; readers see it, old pins still do not.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO \"{pg}\" (id, n, name, extra) VALUES (12, 5000000000, 'p12', 'x-pg')"
        )
        as_of = server_now(conn)
    ice.append(
        pa.table(
            {"id": [21], "n": [21], "name": ["i21"], "extra": ["x-ice"]},
            schema=ice.schema().as_arrow(),
        )
    )
    offs = produce(
        kafka_bootstrap,
        four_kinds["topic"],
        json_values([{"id": 3, "n": 3, "title": "k3", "extra": "x-kafka"}]),
    )
    lake_snap = ducklake.execute(
        "INSERT INTO lake.ev (id, n, name, extra) VALUES (31, 31, 'd31', 'x-lake')"
    )
    client.commit(
        "t",
        updates=[
            {"source": "pg", "state": {"as_of": as_of}},
            {"source": "ice", "state": {"snapshot_id": ice.current_snapshot().snapshot_id}},
            {"source": "kafka", "state": {"low": 0, "high": offs[-1] + 1}},
            {"source": "lake", "state": {"snapshot_id": lake_snap}},
        ],
    )
    latest = client.read("t", filter="extra IS NOT NULL").sort_by("id").to_pylist()
    assert [(r["id"], r["title"], r["extra"]) for r in latest] == [
        (3, "k3", "x-kafka"),
        (12, "p12", "x-pg"),
        (21, "i21", "x-ice"),
        (31, "d31", "x-lake"),
    ]
    assert client.read("t", filter="n > 4000000000").column("id").to_pylist() == [12]
    assert client.read("t", version=v_new).num_rows == 7


def test_failed_ddl_leaves_harness_schema_unchanged(
    client: HarnessClient, four_kinds: dict, pg_dsn: str
) -> None:
    client.add_source(
        "t", "broken", "postgres", config={"dsn": pg_dsn, "table": "no_such_table"}, state={}
    )
    before = client.describe("t")
    with pytest.raises(
        Unavailable, match=r"source 'broken' \(postgres\).*harness schema is unchanged"
    ):
        client.evolve_schema("t", [{"op": "add_column", "name": "extra", "type": "string"}])
    after = client.describe("t")
    assert after.schema == before.schema and after.version == before.version
    # Fix the cause and retry: every statement is idempotent, so it now goes through.
    client.commit("t", remove_sources=["broken"])
    client.evolve_schema("t", [{"op": "add_column", "name": "extra", "type": "string"}])
    assert client.read("t").schema.names[-1] == "extra"
