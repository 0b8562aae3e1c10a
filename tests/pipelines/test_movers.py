"""The one mover (``harness.move``) killed at every step and run again: no row duplicated or
lost, at every version, for each pair of kinds the manifesto's examples move between.

The move runs in the gateway, so the gateway process is what dies (``HARNESS_FAULT_INJECT``
makes it exit at a step of the move, as a SIGKILL would); a new gateway on the same catalog
then finishes the interrupted move and moves what is left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from benchmarks.processes import GatewayProcess
from clients import HarnessClient
from pipelines.mover import Mover
from tests.gateway.helpers import IcebergFixture, versioned_table
from tests.gateway.kafka_helpers import json_values, new_topic, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ARROW = pa.schema([("id", pa.int64()), ("name", pa.string())])
SCHEMA = [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}]
STEPS = [None, "move.after_intent", "move.after_cold", "move.after_drain", "move.after_commit"]
#: A dead gateway's lease ends this fast, so the next move does not wait long.
LIMITS = {"write_lease_s": 2.0}


@contextmanager
def gateway(catalog: str, workdir: Path, crash_at: str | None = None) -> Iterator[HarnessClient]:
    env = {"HARNESS_FAULT_INJECT": crash_at} if crash_at else {}
    gw = GatewayProcess(catalog, workdir, env=env, limits=LIMITS)
    gw.start()
    client = HarnessClient(gw.uri)
    try:
        yield client
    finally:
        client.close()
        gw.stop()


def first_run(catalog: str, tmp: Path, setup: Callable[[HarnessClient], None], move: Any,
              crash_at: str | None) -> int:  # fmt: skip
    """Set the table up and move once on a gateway that dies at ``crash_at``; the version
    the set-up made."""
    with gateway(catalog, tmp, crash_at) as client:
        setup(client)
        made = client.describe("t").version
        if crash_at is None:
            assert Mover(client, "t", *move).run_once().version is not None
        else:
            with pytest.raises(Exception):  # noqa: B017 - the gateway went away mid-call
                Mover(client, "t", *move).run_once()
    return made


def finish(client: HarnessClient, move: Any) -> int:
    """Run the mover until nothing is left; the rows it moved."""
    moved = 0
    while True:
        result = Mover(client, "t", *move, wait_s=30).run_once()
        if result.version is None:
            return moved
        moved += result.rows


def ids_at(client: HarnessClient, version: int | None = None) -> list[int]:
    return sorted(client.read("t", version=version, columns=["id"]).column("id").to_pylist())


def every_version_holds(
    client: HarnessClient, since: int, expected: Callable[[list[int]], bool]
) -> None:
    for v in range(since, client.describe("t").version + 1):
        assert expected(ids_at(client, v)), (v, ids_at(client, v))


@pytest.mark.parametrize("crash_at", STEPS)
def test_kafka_to_iceberg_move_survives_kills(
    tmp_path: Path, kafka_bootstrap: str, iceberg: IcebergFixture, crash_at: str | None
) -> None:
    topic = new_topic(kafka_bootstrap)
    iceberg.create("cold", ARROW)
    cfg = {"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0}
    produce(kafka_bootstrap, topic, json_values([{"id": i, "name": f"n{i}"} for i in range(30)]))

    def setup(client: HarnessClient) -> None:
        client.create_table("t", SCHEMA)
        client.commit("t", add_sources=[
            {"name": "k0", "kind": "kafka", "config": cfg, "state": {"low": 0, "high": 20}},
            {"name": "cold", "kind": "iceberg", "config": iceberg.source_config("cold"),
             "state": {"snapshot_id": None}},
        ])  # fmt: skip

    catalog = f"sqlite:///{tmp_path / 'c.db'}"
    made = first_run(catalog, tmp_path, setup, ("k0", "cold"), crash_at)
    with gateway(catalog, tmp_path) as client:
        assert ids_at(client) == list(range(20))  # in the crash window too
        # More data arrives meanwhile (the dead gateway's lease ends first).
        with client.lock("t", ["k0"], owner="ingester", ttl_s=10, wait_s=30) as lock:
            low = client.describe("t").source("k0").state["low"]
            client.commit("t", lock=lock,
                          updates=[{"source": "k0", "state": {"low": low, "high": 30}}])  # fmt: skip
        finish(client, ("k0", "cold"))
        assert ids_at(client) == list(range(30))
        assert client.describe("t").source("k0").state == {"low": 30, "high": 30}
        every_version_holds(client, made, lambda ids: ids == sorted(set(ids)))  # never a row twice
    # The interrupted append was found again by its commit id, not made a second time.
    assert iceberg.catalog.load_table("db.cold").scan().to_arrow().num_rows == 30


@pytest.mark.parametrize("crash_at", STEPS)
def test_postgres_to_iceberg_move_survives_kills(
    tmp_path: Path, pg_dsn: str, iceberg: IcebergFixture, crash_at: str | None
) -> None:
    name, as_of = versioned_table(pg_dsn, "hot", "id bigint PRIMARY KEY, name text",
                                  "SELECT g, 'n' || g FROM generate_series(0, 19) g")  # fmt: skip
    iceberg.create("pgcold", ARROW)

    def setup(client: HarnessClient) -> None:
        client.create_table("t", SCHEMA, primary_key=["id"])
        client.commit("t", add_sources=[
            {"name": "hot", "kind": "postgres", "config": {"dsn": pg_dsn, "table": name},
             "state": {"as_of": as_of}},
            {"name": "cold", "kind": "iceberg", "config": iceberg.source_config("pgcold"),
             "state": {"snapshot_id": None}},
        ])  # fmt: skip

    catalog = f"sqlite:///{tmp_path / 'c.db'}"
    made = first_run(catalog, tmp_path, setup, ("hot", "cold"), crash_at)
    with gateway(catalog, tmp_path) as client:
        assert ids_at(client) == list(range(20))
        finish(client, ("hot", "cold"))
        assert ids_at(client) == list(range(20))
        every_version_holds(client, made, lambda ids: ids == list(range(20)))
    assert iceberg.catalog.load_table("db.pgcold").scan().to_arrow().num_rows == 20
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{name}"').fetchone() == (0,)


@pytest.mark.parametrize("crash_at", STEPS)
def test_kafka_to_postgres_move_survives_kills(
    tmp_path: Path, kafka_bootstrap: str, pg_dsn: str, crash_at: str | None
) -> None:
    topic = new_topic(kafka_bootstrap)
    name, as_of = versioned_table(pg_dsn, "up", "id bigint PRIMARY KEY, name text")
    # Updates by key: id 3 appears twice; the later offset wins.
    rows = [{"id": i, "name": f"n{i}"} for i in range(10)] + [{"id": 3, "name": "updated"}]
    produce(kafka_bootstrap, topic, json_values(rows))
    cfg = {"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0}

    def setup(client: HarnessClient) -> None:
        client.create_table("t", SCHEMA, primary_key=["id"])
        client.commit("t", add_sources=[
            {"name": "k0", "kind": "kafka", "config": cfg, "state": {"low": 0, "high": 11}},
            {"name": "pg", "kind": "postgres", "config": {"dsn": pg_dsn, "table": name},
             "state": {"as_of": as_of}},
        ])  # fmt: skip

    catalog = f"sqlite:///{tmp_path / 'c.db'}"
    first_run(catalog, tmp_path, setup, ("k0", "pg"), crash_at)
    with gateway(catalog, tmp_path) as client:
        committed = crash_at in (None, "move.after_commit")
        # Before the commit Kafka still holds all 11 messages; after it Postgres holds 10 keys.
        assert len(ids_at(client)) == (10 if committed else 11)
        finish(client, ("k0", "pg"))
        final = client.read("t").sort_by("id").to_pylist()
        assert [r["id"] for r in final] == list(range(10))
        assert next(r["name"] for r in final if r["id"] == 3) == "updated"


@pytest.mark.parametrize("crash_at", STEPS)
def test_postgres_to_ducklake_move_survives_kills(
    tmp_path: Path, pg_dsn: str, ducklake: Any, crash_at: str | None
) -> None:
    name, as_of = versioned_table(pg_dsn, "hot", "id bigint PRIMARY KEY, name text",
                                  "SELECT g, 'n' || g FROM generate_series(0, 19) g")  # fmt: skip
    snap = ducklake.execute("CREATE TABLE lake.cold (id BIGINT, name VARCHAR)")

    def setup(client: HarnessClient) -> None:
        client.create_table("t", SCHEMA, primary_key=["id"])
        client.commit("t", add_sources=[
            {"name": "hot", "kind": "postgres", "config": {"dsn": pg_dsn, "table": name},
             "state": {"as_of": as_of}},
            {"name": "lake", "kind": "ducklake", "config": ducklake.source_config("cold"),
             "state": {"snapshot_id": snap}},
        ])  # fmt: skip

    catalog = f"sqlite:///{tmp_path / 'c.db'}"
    made = first_run(catalog, tmp_path, setup, ("hot", "lake"), crash_at)
    with gateway(catalog, tmp_path) as client:
        assert ids_at(client) == list(range(20))
        finish(client, ("hot", "lake"))
        assert ids_at(client) == list(range(20))
        every_version_holds(client, made, lambda ids: ids == list(range(20)))
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{name}"').fetchone() == (0,)
    from planners.ducklake import connect

    con = connect(ducklake.source_config("cold"))
    try:  # the repeated lake write was found again, not made twice
        assert con.execute(
            "SELECT count(*), count(DISTINCT id) FROM lake.main.cold"
        ).fetchone() == (20, 20)
    finally:
        con.close()
