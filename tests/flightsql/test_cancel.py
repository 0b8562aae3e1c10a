"""Cancelling a statement: ``CancelFlightInfo`` (Flight) and ``CancelQuery`` (Flight SQL) stop
a running statement within a second and free its slots; its stream ends with CANCELLED, never
as a complete result; a DoGet of a cancelled statement's ticket does not run it; another
principal cannot cancel it; closing a result stream early frees the slots too."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from flight_gateway.protocol.flightsql import pack, pb, unpack
from tests.flightsql.test_sql_engine import _numbers
from tests.gateway.helpers import client_for, running_gateway

pytestmark = pytest.mark.integration
#: Seconds of DuckDB work (a recursive count): far longer than the test waits.
LONG = (
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 2000000000) "
    "SELECT (SELECT count(*) FROM r) AS c, count(*) AS k FROM numbers"
)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Any]:
    limits = {"sql_timeout_s": 120.0, "max_concurrent_statements": 1}
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", limits=limits) as (server, _):
        client = client_for(server)
        _numbers(client, tmp_path / "data", 1000)
        yield server
        client.close()


def _info(raw: fl.FlightClient, sql: str) -> fl.FlightInfo:
    command = pack(pb.CommandStatementQuery(query=sql))
    return raw.get_flight_info(fl.FlightDescriptor.for_command(command))


def _cancel_flight_info(raw: fl.FlightClient, info: fl.FlightInfo) -> bytes:
    data = info.serialize()
    body = b"\x0a" + _varint(len(data)) + data  # CancelFlightInfoRequest{info}
    return bytes(next(iter(raw.do_action(fl.Action("CancelFlightInfo", body)))).body)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _running(server: Any) -> int:
    return int(server.core.statements.in_progress())


def _wait(predicate: Any, timeout_s: float) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise AssertionError("timed out")
        time.sleep(0.01)
    return time.monotonic() - start


def _started(server: Any, raw: fl.FlightClient, info: fl.FlightInfo) -> tuple[Any, list]:
    """DoGet in a thread; returns once the statement holds its slot."""
    outcome: list[BaseException | object] = []

    def read() -> None:
        try:
            outcome.append(raw.do_get(info.endpoints[0].ticket).read_all())
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=read)
    t.start()
    _wait(lambda: _running(server) == 1, 30)
    time.sleep(0.3)  # well inside DuckDB's work
    return t, outcome


@pytest.mark.parametrize("action", ["CancelFlightInfo", "CancelQuery"])
def test_cancel_stops_a_running_statement_and_frees_its_slots(gateway: Any, action: str) -> None:
    raw = fl.FlightClient(f"grpc://127.0.0.1:{gateway.port}")
    info = _info(raw, LONG)
    t, outcome = _started(gateway, raw, info)
    if action == "CancelFlightInfo":
        answer = _cancel_flight_info(raw, info)
        assert answer == b"\x08\x01"  # CANCEL_STATUS_CANCELLED
    else:
        request = pack(pb.ActionCancelQueryRequest(info=info.serialize()))
        body = next(iter(raw.do_action(fl.Action("CancelQuery", request)))).body
        reply = unpack(bytes(body))
        assert reply.result == pb.ActionCancelQueryResult.CANCEL_RESULT_CANCELLED
    freed = _wait(lambda: _running(gateway) == 0, 10)
    assert freed < 1.0, f"slots freed after {freed:.2f} s"
    t.join(10)
    assert isinstance(outcome[0], fl.FlightCancelledError), outcome
    # The slot (one statement gateway-wide here) runs the next statement at once.
    assert _info(raw, "SELECT count(*) AS n FROM numbers") is not None
    n = raw.do_get(_info(raw, "SELECT count(*) AS n FROM numbers").endpoints[0].ticket)
    assert n.read_all().to_pylist() == [{"n": 1000}]


def test_a_cancelled_ticket_does_not_run(gateway: Any) -> None:
    raw = fl.FlightClient(f"grpc://127.0.0.1:{gateway.port}")
    info = _info(raw, "SELECT count(*) AS n FROM numbers")
    assert _cancel_flight_info(raw, info) == b"\x08\x01"
    with pytest.raises(fl.FlightCancelledError):
        raw.do_get(info.endpoints[0].ticket).read_all()
    assert _running(gateway) == 0


def test_only_the_issuer_cancels(tmp_path: Path) -> None:
    tokens = {"alice-token-0123456789": {"name": "alice", "read": ["*"], "write": ["*"],
                                         "admin": ["*"]},
              "bob-token-0123456789": {"name": "bob", "read": ["*"]}}  # fmt: skip
    reach = {"paths": [str(tmp_path / "data")]}
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", tokens=tokens, reach=reach,
                         allow_anonymous=False) as (server, _):  # fmt: skip
        alice = client_for(server, token="alice-token-0123456789")
        _numbers(alice, tmp_path / "data", 10)
        uri = f"grpc://127.0.0.1:{server.port}"
        as_alice = fl.FlightCallOptions(
            headers=[(b"authorization", b"Bearer alice-token-0123456789")]
        )
        as_bob = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer bob-token-0123456789")])
        raw = fl.FlightClient(uri)
        command = pack(pb.CommandStatementQuery(query="SELECT count(*) AS n FROM numbers"))
        info = raw.get_flight_info(fl.FlightDescriptor.for_command(command), as_alice)
        data = info.serialize()
        body = b"\x0a" + _varint(len(data)) + data
        with pytest.raises(pa.ArrowInvalid, match="another principal"):
            list(raw.do_action(fl.Action("CancelFlightInfo", body), as_bob))
        table = raw.do_get(info.endpoints[0].ticket, as_alice).read_all()
        assert table.to_pylist() == [{"n": 10}]
        alice.close()


def test_closing_the_stream_early_frees_the_slots(gateway: Any) -> None:
    raw = fl.FlightClient(f"grpc://127.0.0.1:{gateway.port}")
    big = "SELECT a.i, b.i AS j FROM numbers a, numbers b"  # a million rows, streamed
    reader = raw.do_get(_info(raw, big).endpoints[0].ticket)
    reader.read_chunk()
    assert _running(gateway) == 1
    reader.cancel()
    _wait(lambda: _running(gateway) == 0, 10)


def test_bad_cancel_requests_are_invalid_argument(gateway: Any) -> None:
    raw = fl.FlightClient(f"grpc://127.0.0.1:{gateway.port}")
    with pytest.raises(pa.ArrowInvalid, match="needs the FlightInfo to cancel"):
        list(raw.do_action(fl.Action("CancelFlightInfo", b"\x0a\x05abc")))
    native = raw.get_flight_info(fl.FlightDescriptor.for_command(b'{"table": "numbers"}'))
    data = native.serialize()
    answer = next(iter(raw.do_action(fl.Action("CancelFlightInfo",
                                               b"\x0a" + _varint(len(data)) + data)))).body  # fmt: skip
    assert bytes(answer) == b"\x08\x03"  # NOT_CANCELLABLE: a native read streams, no statement
