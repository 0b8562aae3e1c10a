"""OpenTelemetry end to end: one client read over three kinds (files, Iceberg, versioned
Postgres) inside a caller's span is one trace: the gateway's call spans are children of the
caller's span (W3C traceparent sent by the client), planning has a span per source, each DoGet
has its scan, a DoPut has validate/lock/write/commit; the gateway's log lines carry the trace
id. With tracing off nothing is recorded."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from clients import HarnessClient
from flight_gateway.core import tracing
from planners.postgres.versioning import enable_versioning, server_now
from tests.gateway.helpers import IcebergFixture, client_for, running_gateway, write_parquet

pytestmark = pytest.mark.integration
ARROW = pa.schema([("id", pa.int64()), ("region", pa.string())])


@pytest.fixture
def spans() -> Iterator[Any]:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracing.configure(exporter=exporter)
    yield exporter
    tracing.disable()


def _table(client: HarnessClient, tmp_path: Path, pg_dsn: str) -> None:
    write_parquet(tmp_path / "f" / "a.parquet", pa.table({"id": [1, 2], "region": ["f", "f"]}))
    ice = IcebergFixture(tmp_path / "ice")
    t = ice.create("tr", ARROW)
    t.append(pa.table({"id": [3], "region": ["i"]}, schema=ARROW))
    pg = f"tr_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{pg}" (id bigint, region text)')
        enable_versioning(conn, pg)
        conn.execute(f"INSERT INTO \"{pg}\" VALUES (4, 'p')")
        as_of = server_now(conn)
    client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "region", "type": "string"}], partition_by=["region"])  # fmt: skip
    client.commit(
        "t",
        add_sources=[
            {
                "name": "f",
                "kind": "files",
                "partition": {"region": "f"},
                "config": {"root": str(tmp_path / "f")},
                "state": {"files": ["a.parquet"]},
            },
            {
                "name": "i",
                "kind": "iceberg",
                "partition": {"region": "i"},
                "config": ice.source_config("tr"),
                "state": {"snapshot_id": t.current_snapshot().snapshot_id},
            },
            {
                "name": "p",
                "kind": "postgres",
                "partition": {"region": "p"},
                "config": {"dsn": pg_dsn, "table": pg},
                "state": {"as_of": as_of},
            },
        ],
    )


def test_one_read_is_one_trace_with_linked_spans(
    spans: Any, tmp_path: Path, pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}") as (server, _):
        client = client_for(server)
        _table(client, tmp_path, pg_dsn)
        spans.clear()
        caplog.set_level(logging.INFO, logger="flight_gateway")
        with tracing.span("caller.read") as root:
            assert sorted(client.read("t").column("id").to_pylist()) == [1, 2, 3, 4]
        client.close()
    trace_id = root.get_span_context().trace_id
    done = spans.get_finished_spans()
    by_id = {s.context.span_id: s for s in done}
    assert {s.context.trace_id for s in done} == {trace_id}  # one trace
    names = [s.name for s in done]
    assert names.count("flight.GET_FLIGHT_INFO") == 1 and names.count("flight.DO_GET") == 3

    def parent(s: Any) -> Any:
        return by_id.get(s.parent.span_id) if s.parent else None

    for s in done:
        if s.name.startswith("flight."):
            assert parent(s) is not None and parent(s).name == "caller.read"
        if s.name == "plan.source":
            assert parent(s).name == "plan" and parent(parent(s)).name == "flight.GET_FLIGHT_INFO"
        if s.name == "scan":
            assert parent(s).name == "flight.DO_GET"
            assert int(s.attributes["batches"]) >= 1
    assert sorted(s.attributes["source"] for s in done if s.name == "plan.source") == [
        "f",
        "i",
        "p",
    ]
    assert sorted(s.attributes["kind"] for s in done if s.name == "scan") == ["files", "iceberg", "postgres"]  # fmt: skip
    planned = [r for r in caplog.records if r.getMessage().startswith("planned t@")]
    assert planned and planned[0].trace_id == format(trace_id, "032x")


def test_doput_spans(spans: Any, tmp_path: Path, pg_dsn: str) -> None:
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}") as (server, _):
        client = client_for(server)
        _table(client, tmp_path, pg_dsn)
        spans.clear()
        client.put("t", pa.table({"id": [9], "region": ["p"]}), source="p")
        client.close()
    done = {s.name: s for s in spans.get_finished_spans()}
    put = done["flight.DO_PUT"]
    for name in ("validate", "lock.wait", "write", "commit"):
        assert done[name].parent.span_id == put.context.span_id, name
    assert done["write"].attributes["kind"] == "postgres"


def test_off_records_nothing(tmp_path: Path) -> None:
    assert not tracing.enabled()
    with tracing.span("x") as s:
        assert s is None
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}") as (server, _):
        client = client_for(server)
        assert client.list_tables() == []
        client.close()


def test_file_exporter_writes_one_json_span_per_line(tmp_path: Path) -> None:
    """``exporter = "file"`` is JSON lines, as docs/operations.md says: every line parses."""
    import json

    path = tmp_path / "spans.jsonl"
    settings = {"exporter": "file", "path": str(path)}
    try:
        with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", tracing=settings) as (server, _):
            client = client_for(server)
            client.create_table("t", [{"name": "id", "type": "int64"}])
            assert client.read("t").num_rows == 0
            client.close()
    finally:
        tracing.disable()  # exports the spans still queued
    lines = path.read_text().splitlines()
    spans = [json.loads(line) for line in lines]
    assert len(spans) >= 3 and all(isinstance(s, dict) for s in spans)
    names = {s["name"] for s in spans}
    assert {"flight.DO_ACTION", "flight.GET_FLIGHT_INFO"} <= names, names
