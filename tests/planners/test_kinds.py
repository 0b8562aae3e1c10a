"""Each built-in kind's ``plan``/``read`` (and its capabilities) called directly: no gateway, no
catalog — the contract a kind implements, on real files, tables, brokers and servers."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from planners import registry
from planners.execute import execute
from planners.kind import (
    AdoptsFiles,
    Appendable,
    AppendContext,
    ColumnSpec,
    Drains,
    EvolvesSchema,
    Merges,
    ScanRequest,
    SourceKind,
    SourceRef,
    Streams,
)
from planners.postgres.versioning import enable_versioning, server_now
from planners.predicates import parse_filter
from tests.gateway.helpers import DuckLakeFixture, IcebergFixture, write_parquet
from tests.gateway.kafka_helpers import json_values, new_topic, produce

ARROW = pa.schema([("id", pa.int64()), ("name", pa.string())])
COLS = (ColumnSpec(1, "id", "int64"), ColumnSpec(2, "name", "string"))


def data(ids: range) -> pa.Table:
    return pa.table({"id": list(ids), "name": [f"n{i}" for i in ids]}, schema=ARROW)


def request(kind: str, config: Mapping[str, Any], state: Mapping[str, Any], flt: str | None = None):
    pred = parse_filter(flt, ARROW)
    return ScanRequest(SourceRef("s", kind, config, {}, state), COLS, pred)


def read_all(kind: SourceKind, req: ScanRequest) -> list[int]:
    """Every task of a plan through ``execute`` (residual filter, projection)."""
    ids = []
    for task in kind.plan(req):
        ids += execute(kind, req, task, ["id"]).read_all().column("id").to_pylist()
    return sorted(ids)


def test_capabilities_are_what_each_kind_declares() -> None:
    capabilities = (Appendable, AdoptsFiles, EvolvesSchema, Streams, Merges, Drains)
    kinds = ("files", "iceberg", "ducklake", "flight", "kafka", "postgres", "delta", "paimon")
    caps = {
        name: {c.__name__ for c in capabilities if isinstance(registry.get_kind(name), c)}
        for name in kinds
    }
    assert caps == {
        "files": {"Appendable", "AdoptsFiles", "Streams"},
        "iceberg": {"Appendable", "AdoptsFiles", "EvolvesSchema", "Merges", "Streams"},
        "ducklake": {"Appendable", "EvolvesSchema", "Merges"},  # a move's cold side
        "flight": set(),
        "kafka": {"Appendable", "Drains", "Streams"},
        "postgres": {"Appendable", "Drains", "EvolvesSchema", "Merges", "Streams"},
        "delta": {"Appendable", "EvolvesSchema", "Streams"},
        "paimon": {"Appendable", "EvolvesSchema", "Streams"},
    }
    assert [registry.get_kind(k).dedupe_tier for k in ("kafka", "postgres", "files")] == [2, 1, 0]


def test_files_plan_read_append_adopt_and_added(tmp_path: Path) -> None:
    kind = registry.get_kind("files")
    write_parquet(tmp_path / "a.parquet", data(range(0, 5)))
    write_parquet(tmp_path / "b.parquet", data(range(5, 9)))
    config = {"root": str(tmp_path)}
    req = request("files", config, {"files": ["a.parquet", "b.parquet"]}, "id >= 3")
    assert read_all(kind, req) == [3, 4, 5, 6, 7, 8]
    ctx = AppendContext(req.source, "c1", {})
    state = kind.append(ctx, data(range(9, 11)))
    assert kind.append(ctx, data(range(9, 11))) == state  # same commit id: same file
    assert read_all(kind, request("files", config, state)) == list(range(11))
    staged = kind.staging_location(req.source, "w1")
    write_parquet(Path(staged) / "x.parquet", data(range(20, 22)))
    adopted = kind.adopt_files(
        req.source, [f"{staged}/x.parquet"], replace=True, commit_id="w", relocation=True
    )
    assert adopted["files"] == ["spark-w1/x.parquet"]
    new = request("files", config, state)
    assert read_all(kind, ScanRequest(new.source, COLS)) == list(range(11))
    added = kind.plan_added(ScanRequest(new.source, COLS), {"files": ["a.parquet"]})
    assert [t.payload["files"] for t in added] == [["b.parquet", state["files"][-1]]]


def test_iceberg_plan_read_append_and_added(iceberg: IcebergFixture) -> None:
    kind = registry.get_kind("iceberg")
    table = iceberg.create("unit", ARROW)
    table.append(data(range(0, 6)))
    first = table.current_snapshot().snapshot_id
    config = iceberg.source_config("unit")
    req = request("iceberg", config, {"snapshot_id": first}, "name = 'n4' OR id < 2")
    assert read_all(kind, req) == [0, 1, 4]
    state = kind.append(AppendContext(req.source, "c9", {}), data(range(6, 8)))
    again = kind.append(AppendContext(req.source, "c9", {}), data(range(6, 8)))
    assert again == state and read_all(kind, request("iceberg", config, state)) == list(range(8))
    pinned = request("iceberg", config, {"snapshot_id": first})
    assert read_all(kind, pinned) == list(range(6))  # the old snapshot never changes
    later = request("iceberg", config, state)
    tasks = kind.plan_added(later, {"snapshot_id": first})
    ids = [
        i
        for t in tasks
        for i in execute(kind, later, t, ["id"]).read_all().column("id").to_pylist()
    ]
    assert sorted(ids) == [6, 7]


@pytest.mark.parametrize("published", [True, False])
def test_iceberg_write_whose_commit_never_landed_is_neither_published_nor_doubled(
    iceberg: IcebergFixture, published: bool
) -> None:
    """A gateway died between a DoPut's Iceberg append ("a", rows 6-7) and its catalog commit.
    The next writer of the source (the lock's lease ran out) appends from the published state,
    not on top of the abandoned snapshot; the dead DoPut's retry (same commit id) then appends
    its rows once. Before, the next writer published "a"'s rows and the retry wrote them again
    (the failover chaos bench read 100 rows twice). Also from a table with no snapshot yet."""
    kind = registry.get_kind("iceberg")
    table = iceberg.create("unit", ARROW)
    config = iceberg.source_config("unit")
    state: dict[str, Any] = {"snapshot_id": None}
    if published:
        table.append(data(range(0, 6)))
        state = {"snapshot_id": table.current_snapshot().snapshot_id}
    base = list(range(6)) if published else []
    source = request("iceberg", config, state).source
    kind.append(AppendContext(source, "a", {}, table="t"), data(range(6, 8)))  # never lands
    after_b = kind.append(AppendContext(source, "b", {}, table="t"), data(range(8, 10)))
    assert read_all(kind, request("iceberg", config, after_b)) == [*base, 8, 9]
    retried = request("iceberg", config, after_b).source
    after_a = kind.append(AppendContext(retried, "a", {}, table="t"), data(range(6, 8)))
    assert read_all(kind, request("iceberg", config, after_a)) == [*base, 6, 7, 8, 9]
    table.refresh()  # pyiceberg, the peer, reads the table's current snapshot the same
    got = table.scan().to_arrow().column("id").to_pylist()
    assert sorted(got) == sorted([*base, 6, 7, 8, 9])


def test_iceberg_another_harness_tables_write_is_written_on_top_of(
    iceberg: IcebergFixture,
) -> None:
    """Two harness tables writing one Iceberg table: a write past this table's published
    state that another harness table made is that table's data, never dropped as abandoned."""
    kind = registry.get_kind("iceberg")
    table = iceberg.create("shared", ARROW)
    table.append(data(range(0, 2)))
    state = {"snapshot_id": table.current_snapshot().snapshot_id}
    config = iceberg.source_config("shared")
    source = request("iceberg", config, state).source
    kind.append(AppendContext(source, "u1", {}, table="u"), data(range(2, 4)))
    after = kind.append(AppendContext(source, "t1", {}, table="t"), data(range(4, 6)))
    assert read_all(kind, request("iceberg", config, after)) == list(range(6))


def test_ducklake_read_at_a_snapshot(ducklake: DuckLakeFixture) -> None:
    kind = registry.get_kind("ducklake")
    ducklake.execute("CREATE TABLE lake.u (id BIGINT, name VARCHAR)")
    s1 = ducklake.execute("INSERT INTO lake.u SELECT i, 'n' || i FROM range(5) t(i)")
    ducklake.execute("INSERT INTO lake.u SELECT i, 'n' || i FROM range(5, 9) t(i)")
    req = request("ducklake", ducklake.source_config("u"), {"snapshot_id": s1}, "id > 1")
    assert read_all(kind, req) == [2, 3, 4]


@pytest.mark.integration
def test_kafka_exact_ranges_append_and_added(kafka_bootstrap: str) -> None:
    kind = registry.get_kind("kafka")
    topic = new_topic(kafka_bootstrap)
    offs = produce(
        kafka_bootstrap, topic, json_values([{"id": i, "name": f"n{i}"} for i in range(10)])
    )
    config = {
        "bootstrap_servers": kafka_bootstrap,
        "topic": topic,
        "partition": 0,
        "max_task_messages": 3,
    }
    req = request("kafka", config, {"low": 2, "high": offs[-1] + 1}, "id <> 5")
    assert kind.plan(req)[0].payload == {"low": 2, "high": 5}
    assert read_all(kind, req) == [2, 3, 4, 6, 7, 8, 9]
    intents: list[Mapping[str, Any]] = []
    ctx = AppendContext(req.source, "put-1", {}, None, intents.append)
    state = kind.append(ctx, data(range(10, 13)))
    assert intents == [{"start": offs[-1] + 1}] and state["high"] == offs[-1] + 4
    retry = AppendContext(req.source, "put-1", {}, intents[0], intents.append)
    assert kind.append(retry, data(range(10, 13)))["high"] == state["high"]  # nothing twice
    after = request("kafka", config, state)
    tasks = kind.plan_added(after, {"low": 0, "high": offs[-1] + 1})
    assert sum(t.payload["high"] - t.payload["low"] for t in tasks) == 3


@pytest.fixture
def pg_table(pg_dsn: str) -> Iterator[tuple[str, str]]:
    name = f"unit_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{name}" (id bigint PRIMARY KEY, name text)')
        enable_versioning(conn, name)
        conn.execute(f"INSERT INTO \"{name}\" SELECT g, 'n' || g FROM generate_series(0, 4) g")
        yield name, server_now(conn)


@pytest.mark.integration
def test_postgres_as_of_append_and_added(pg_dsn: str, pg_table: tuple[str, str]) -> None:
    kind = registry.get_kind("postgres")
    name, as_of = pg_table
    config = {"dsn": pg_dsn, "table": name}
    req = request("postgres", config, {"as_of": as_of}, "id >= 2")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DELETE FROM "{name}" WHERE id = 3')  # after as_of: still visible there
    assert read_all(kind, req) == [2, 3, 4]
    state = kind.append(AppendContext(req.source, "p1", {}), data(range(5, 7)))
    assert (
        kind.append(AppendContext(req.source, "p1", {}), data(range(5, 7)))["as_of"]
        >= state["as_of"]
    )
    later = request("postgres", config, state)
    assert read_all(kind, later) == [0, 1, 2, 4, 5, 6]
    tasks = kind.plan_added(later, {"as_of": as_of})
    ids = [
        i
        for t in tasks
        for i in execute(kind, later, t, ["id"]).read_all().column("id").to_pylist()
    ]
    assert sorted(ids) == [5, 6]  # the delete adds no row


class _Upstream(fl.FlightServerBase):
    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        return fl.RecordBatchStream(data(range(int(ticket.ticket.decode()))))

    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        eps = [fl.FlightEndpoint(b"3", []), fl.FlightEndpoint(b"2", [])]
        return fl.FlightInfo(ARROW, descriptor, eps, -1, -1)


def test_flight_proxies_upstream_endpoints() -> None:
    server = _Upstream("grpc://127.0.0.1:0")
    threading.Thread(target=server.serve, daemon=True).start()
    try:
        kind = registry.get_kind("flight")
        config = {"location": f"grpc://127.0.0.1:{server.port}", "descriptor": {"path": ["x"]}}
        req = request("flight", config, {}, "id > 0")
        assert len(kind.plan(req)) == 2 and read_all(kind, req) == [1, 1, 2]
    finally:
        server.shutdown()
