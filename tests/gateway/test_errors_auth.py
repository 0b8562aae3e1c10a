"""Bad input gets the right Flight status and a clear message; the server keeps serving."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import (
    AlreadyExists,
    Conflict,
    InvalidArgument,
    LockExpired,
    NotFound,
    Unauthenticated,
    Unauthorized,
)
from tests.gateway.helpers import client_for, running_gateway, write_parquet

SCHEMA = [{"name": "id", "type": "int64"}, {"name": "level", "type": "string"}]


@pytest.fixture
def table(client: HarnessClient, tmp_path: Path) -> HarnessClient:
    write_parquet(
        tmp_path / "a.parquet",
        pa.table({"id": pa.array(range(10), pa.int64()), "level": ["x"] * 10}),
    )
    client.create_table("t", SCHEMA)
    client.add_source(
        "t", "f", "files", config={"root": str(tmp_path)}, state={"files": ["a.parquet"]}
    )
    return client


def raw(server) -> fl.FlightClient:
    return fl.connect(f"grpc://127.0.0.1:{server.port}")


def cmd(body: object) -> fl.FlightDescriptor:
    return fl.FlightDescriptor.for_command(
        body if isinstance(body, bytes) else json.dumps(body).encode()
    )


@pytest.mark.parametrize(
    ("descriptor", "message"),
    [
        (b"{not json", "not valid UTF-8 JSON"),
        (b"[1, 2]", "must be a JSON object"),
        ({"columns": ["id"]}, "needs 'table'"),
        ({"table": "t", "colums": ["id"]}, "unknown read descriptor field"),
        ({"table": "t", "columns": ["nope"]}, "unknown column(s) ['nope']"),
        ({"table": "t", "filter": "nope = 1"}, "unknown column 'nope'"),
        ({"table": "t", "filter": "id = 'abc'"}, "does not fit column 'id'"),
        ({"table": "t", "filter": "id = 1; DROP TABLE x"}, "unsupported filter expression"),
        ({"table": "t", "filter": "lower(level) = 'x'"}, "unsupported filter expression"),
        ({"table": "t", "filter": "level LIKE '%x'"}, "only LIKE 'prefix%'"),
        ({"table": "t", "filter": "id = "}, "cannot parse filter"),
        ({"table": "t", "version": -1}, "'version' must be an integer >= 0"),
    ],
)
def test_bad_descriptors_are_invalid_argument(gateway, table, descriptor, message) -> None:
    server, _ = gateway
    with raw(server) as c:
        with pytest.raises(pa.ArrowInvalid, match=None) as info:
            c.get_flight_info(cmd(descriptor))
        assert message in str(info.value)
        # ... and the server is still serving.
        assert c.get_flight_info(fl.FlightDescriptor.for_path("t")).schema.names == ["id", "level"]


def test_unknown_table_and_version_are_not_found(table: HarnessClient) -> None:
    with pytest.raises(NotFound, match="'nope' does not exist"):
        table.read("nope")
    with pytest.raises(NotFound, match="no version 99"):
        table.read("t", version=99)


def test_tampered_and_expired_tickets(gateway, table: HarnessClient, tmp_path: Path) -> None:
    server, _ = gateway
    info = table.flight_info("t")
    ticket = info.endpoints[0].ticket.ticket
    prefix, body, mac = ticket.split(b".")
    payload = json.loads(base64.urlsafe_b64decode(body + b"=" * (-len(body) % 4)))
    payload["table"] = "other"
    forged = (
        prefix
        + b"."
        + base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=")
        + b"."
        + mac
    )
    with raw(server) as c:
        for bad in (forged, ticket[:-3] + b"AAA", b"garbage"):
            with pytest.raises(pa.ArrowInvalid, match="ticket"):
                c.do_get(fl.Ticket(bad)).read_all()
        assert c.do_get(fl.Ticket(ticket)).read_all().num_rows == 10
    with running_gateway(f"sqlite:///{tmp_path / 'c2.db'}", ticket_ttl_s=0.2) as (short, _):
        c2 = client_for(short)
        c2.create_table("t", SCHEMA)
        c2.add_source(
            "t", "f", "files", config={"root": str(tmp_path)}, state={"files": ["a.parquet"]}
        )
        ep = c2.flight_info("t").endpoints[0]
        time.sleep(0.4)
        with pytest.raises(InvalidArgument, match="expired"):
            c2.read_endpoint(ep).read_all()
        assert c2.read("t").num_rows == 10  # fresh tickets work
        c2.close()


def test_action_errors_map_to_codes(table: HarnessClient) -> None:
    with pytest.raises(AlreadyExists):
        table.create_table("t", SCHEMA)
    with pytest.raises(InvalidArgument, match="unknown Arrow type"):
        table.create_table("u", [{"name": "a", "type": "int99"}])
    version = table.describe("t").version
    with pytest.raises(Conflict, match="expected 5"):
        table.commit(
            "t", updates=[{"source": "f", "state": {"files": []}, "expect_state_version": 5}]
        )
    lock = table.lock("t", ["f"], ttl_s=0.2)
    time.sleep(0.4)
    with pytest.raises(LockExpired):
        table.commit("t", lock=lock, updates=[{"source": "f", "state": {"files": []}}])
    assert table.describe("t").version == version
    with pytest.raises(NotImplementedError):
        table.action("harness.no_such_action")
    with pytest.raises(pa.ArrowNotImplementedError):
        table.action("harness.no_such_action")


def test_create_table_takes_its_commit_id(table: HarnessClient) -> None:
    """``harness.create_table`` listed ``commit_id`` but dropped it (the history showed
    ``create-<uuid>``, and a retry was ALREADY_EXISTS): now it is the creation's commit id, and
    the same create sent again answers ``applied: false``; another id still ALREADY_EXISTS."""
    body = {"table": "c", "schema": SCHEMA, "commit_id": "make-c-1"}
    first = table.action("harness.create_table", body)
    assert first == {"table": "c", "version": 0, "applied": True}
    assert table.history("c")[-1].commit_id == "make-c-1"
    again = table.action("harness.create_table", body)
    assert again == {"table": "c", "version": 0, "applied": False}
    with pytest.raises(AlreadyExists):
        table.action("harness.create_table", {**body, "commit_id": "make-c-2"})
    with pytest.raises(AlreadyExists, match="another schema"):  # the same id, another table
        table.action("harness.create_table", {**body, "schema": SCHEMA[:1]})
    with pytest.raises(AlreadyExists):
        table.action("harness.create_table", {k: v for k, v in body.items() if k != "commit_id"})
    with pytest.raises(InvalidArgument, match="commit_id"):
        table.action("harness.create_table", {**body, "table": "d", "commit_id": "x" * 257})
    assert table.create_table("e", SCHEMA, commit_id="make-e") == 0
    assert table.create_table("e", SCHEMA, commit_id="make-e") == 0  # the same create again


def test_commit_write_needs_paths(table: HarnessClient) -> None:
    """A ``commit_write`` without ``paths`` committed no files, and with ``overwrite`` a new
    version whose source held nothing; now INVALID_ARGUMENT naming the field, nothing
    committed (an explicit ``[]`` still says "no files")."""
    version = table.describe("t").version
    begun = table.begin_write("t", "f")
    with pytest.raises(InvalidArgument, match="paths"):
        table.action("harness.commit_write", {"table": "t", "write_id": begun["write_id"],
                                              "source": "f", "overwrite": True})  # fmt: skip
    assert table.describe("t").version == version
    table.abort_write("t", begun["write_id"], "f")


def test_describe_redacts_secrets(table: HarnessClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_SECRET_TOKEN", "s3cr3t-value")
    table.add_source(
        "t", "pg", "postgres", config={"dsn": "postgresql://u:hunter2@db/x", "table": "x"}
    )
    table.add_source("t", "up", "flight", config={"location": "grpc://h:1", "token": "hunter2"})
    table.add_source(
        "t", "up2", "flight", config={"location": "grpc://h:1", "token": "${HARNESS_SECRET_TOKEN}"}
    )
    info = table.describe("t")
    shown = json.dumps([dict(s.config) for s in info.sources])
    assert "hunter2" not in shown and "s3cr3t-value" not in shown
    assert info.source("up2").config["token"] == "${HARNESS_SECRET_TOKEN}"


def test_bad_source_config_is_rejected_at_commit(table: HarnessClient) -> None:
    version = table.describe("t").version
    with pytest.raises(InvalidArgument, match="unknown config key"):
        table.add_source("t", "f", "files", config={"roots": "/tmp"})
    with pytest.raises(InvalidArgument, match="'partition' must be an integer"):
        table.add_source(
            "t", "k", "kafka", config={"bootstrap_servers": "x", "topic": "t", "partition": "0"}
        )
    with pytest.raises(InvalidArgument, match="low <= high"):
        table.add_source(
            "t",
            "k",
            "kafka",
            config={"bootstrap_servers": "x", "topic": "t", "partition": 0},
            state={"low": 5, "high": 1},
        )
    with pytest.raises(InvalidArgument, match="unknown source kind"):
        table.add_source("t", "z", "zzz")
    assert table.describe("t").version == version


def test_bearer_auth(tmp_path: Path) -> None:
    tokens = {
        "reader-token": {"name": "reader", "read": ["*"]},
        "writer-token": {"name": "writer", "read": ["*"], "write": ["t*"], "admin": ["t*"]},
    }
    with running_gateway(
        f"sqlite:///{tmp_path / 'c.db'}",
        allow_anonymous=False,
        tokens=tokens,
        reach={"paths": [str(tmp_path)]},
    ) as (server, _):
        anon, bad = client_for(server), client_for(server, token="wrong")
        reader, writer = (
            client_for(server, token="reader-token"),
            client_for(server, token="writer-token"),
        )
        for c in (anon, bad):
            with pytest.raises(Unauthenticated):
                c.list_tables()
            with pytest.raises(Unauthenticated):
                c.read("t")
        writer.create_table("t", SCHEMA)
        with pytest.raises(Unauthorized, match="'reader' may not admin"):
            reader.create_table("t2", SCHEMA)
        with pytest.raises(Unauthorized):
            writer.create_table("other", SCHEMA)
        write_parquet(
            tmp_path / "a.parquet", pa.table({"id": pa.array([1], pa.int64()), "level": ["x"]})
        )
        writer.add_source(
            "t", "f", "files", config={"root": str(tmp_path)}, state={"files": ["a.parquet"]}
        )
        info = reader.flight_info("t")
        assert reader.read("t").num_rows == 1
        # DoGet is authenticated too: a valid ticket without a token is refused.
        with pytest.raises(Unauthenticated):
            anon.read_endpoint(info.endpoints[0]).read_all()
        for c in (anon, bad, reader, writer):
            c.close()


def test_get_schema_errors_keep_their_status(tmp_path: Path) -> None:
    """pyarrow's server sent every GetSchema error but INVALID_ARGUMENT and NOT_FOUND as a bare
    UNKNOWN, and the client raised a plain ArrowException("Unknown error"): a caller could not
    tell a refusal from a failure. The status now travels in the message (``[UNAUTHORIZED] ...``)
    and the client raises the typed error."""
    tokens = {"admin-token": {"name": "admin", "admin": ["*"]},
              "reader-token": {"name": "reader", "read": ["other"]}}  # fmt: skip
    with running_gateway(
        f"sqlite:///{tmp_path / 'c.db'}", allow_anonymous=False, tokens=tokens,
        reach={"paths": [str(tmp_path)]},
    ) as (server, _):  # fmt: skip
        admin, reader = client_for(server, "admin-token"), client_for(server, "reader-token")
        admin.create_table("t", SCHEMA)
        with pytest.raises(Unauthorized, match="'reader' may not read table 't'"):
            reader.schema("t")
        with pytest.raises(Unauthenticated):
            client_for(server, token="wrong").schema("t")
        with pytest.raises(NotFound):
            admin.schema("missing")
        raw = fl.connect(f"grpc://127.0.0.1:{server.port}")
        options = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer reader-token")])
        with pytest.raises(pa.ArrowException, match=r"\[UNAUTHORIZED\] 'reader' may not read"):
            raw.get_schema(fl.FlightDescriptor.for_command(b'{"table": "t"}'), options)
        raw.close()
        assert admin.schema("t").names == [f["name"] for f in SCHEMA]
        admin.close()
        reader.close()
