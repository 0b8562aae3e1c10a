"""DoPut resource limits (security audit: a ~100 KB zstd-compressed record batch expanded to
gigabytes in the gateway before ``max_upload_bytes`` refused it, and nothing bounded concurrent
uploads). Each test failed before its fix; docs/security.md, "DoPut", says what is bounded."""

from __future__ import annotations

import contextlib
import json
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from clients import HarnessClient
from flight_gateway.app import GatewayConfig, HarnessFlightServer
from flight_gateway.core.config import Limits
from flight_gateway.protocol.errors import ResourceExhausted
from flight_gateway.protocol.flight_errors import from_flight_error
from tests.gateway.helpers import client_for, running_gateway, write_parquet

SCHEMA = [{"name": "id", "type": "int64"}]
TOKENS = {
    "admin-token": {"name": "admin", "admin": ["*"]},
    "writer-token": {"name": "writer", "write": ["t*"]},
    "writer2-token": {"name": "writer2", "write": ["t*"]},
    "reader-token": {"name": "reader", "read": ["t*"]},
}
#: 320 MB of int64 zeros once decoded, about 10 KB with zstd: CI-friendly, yet 20x the limit.
BOMB_ROWS = 40_000_000
ZSTD = fl.FlightCallOptions(write_options=pa.ipc.IpcWriteOptions(compression="zstd"))


class Gw:
    def __init__(self, server: HarnessFlightServer, data: Path) -> None:
        self.server, self.data = server, data
        # Refusals by a full limit raise at once here (no waiting for a slot to free).
        self.c: dict[str, HarnessClient] = {
            t.split("-")[0]: client_for(server, token=t, busy_wait_s=0) for t in TOKENS
        }

    def flight(self, token: str) -> tuple[fl.FlightClient, fl.FlightCallOptions]:
        """A raw Flight client (to send compressed batches) and its call options."""
        headers = [(b"authorization", f"Bearer {token}".encode())]
        opts = fl.FlightCallOptions(headers=headers, write_options=ZSTD.write_options)
        return fl.FlightClient(f"grpc://127.0.0.1:{self.server.port}"), opts

    def state(self) -> tuple[int, list[str]]:
        """The table's version and every file under the source's root."""
        files = sorted(str(p.relative_to(self.data)) for p in self.data.rglob("*"))
        return self.c["reader"].describe("t").version, files

    def ids(self) -> list[int]:
        return sorted(self.c["reader"].read("t").column("id").to_pylist())


@contextlib.contextmanager
def gateway(tmp_path: Path, **limits: Any) -> Iterator[Gw]:
    data = tmp_path / "data"
    write_parquet(data / "a.parquet", pa.table({"id": [1, 2, 3]}))
    config = {"tokens": TOKENS, "allow_anonymous": False, "reach": {"paths": [str(data)]}}
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", limits=limits, **config) as (server, _):
        gw = Gw(server, data)
        try:
            gw.c["admin"].create_table("t", SCHEMA)
            gw.c["admin"].add_source(
                "t", "f", "files", config={"root": str(data)}, state={"files": ["a.parquet"]}
            )
            yield gw
        finally:
            for c in gw.c.values():
                c.close()


def descriptor(commit_id: str) -> fl.FlightDescriptor:
    return fl.FlightDescriptor.for_command(json.dumps({"table": "t", "commit_id": commit_id}))


def put_compressed(gw: Gw, token: str, data: pa.Table, commit_id: str) -> None:
    client, opts = gw.flight(token)
    try:
        writer, reply = client.do_put(descriptor(commit_id), data.schema, opts)
        writer.write_table(data)
        writer.done_writing()
        reply.read()
        writer.close()
    except fl.FlightError as e:
        raise from_flight_error(e) from e
    finally:
        client.close()


@contextlib.contextmanager
def held_upload(gw: Gw, token: str, name: str, commit_id: str) -> Iterator[None]:
    """A DoPut that has sent one batch and keeps its stream open: it holds an upload slot
    until the block ends, then finishes (and commits) normally."""
    client, opts = gw.flight(token)
    writer, reply = client.do_put(descriptor(commit_id), pa.schema([("id", pa.int64())]), opts)
    try:
        writer.write_table(pa.table({"id": [100]}))
        slots = gw.server.core.uploads
        deadline = time.monotonic() + 10
        while slots.in_progress(name) < 1:  # the gateway is now reading this upload
            assert time.monotonic() < deadline, "the held upload never reached the gateway"
            time.sleep(0.01)
        yield
    finally:
        writer.done_writing()
        reply.read()
        writer.close()
        client.close()


# ---------------------------------------------------------------- the compression bomb


def test_a_compression_bomb_fails_alone_and_changes_nothing(tmp_path: Path) -> None:
    with gateway(tmp_path, max_upload_bytes=16 << 20) as gw:
        before = gw.state()
        zeros = pa.py_buffer(bytes(8 * BOMB_ROWS))
        bomb = pa.table({"id": pa.Array.from_buffers(pa.int64(), BOMB_ROWS, [None, zeros])})
        spans: list[tuple[float, float, int]] = []
        errors: list[BaseException] = []
        done = threading.Event()

        def read_meanwhile() -> None:  # another principal, reading while the bomb is decoded
            while not done.is_set():
                started = time.monotonic()
                try:
                    rows = gw.c["reader"].read("t").num_rows
                except BaseException as e:
                    errors.append(e)
                    return
                spans.append((started, time.monotonic(), rows))

        reader = threading.Thread(target=read_meanwhile)
        reader.start()
        try:
            sent = time.monotonic()
            with pytest.raises(ResourceExhausted, match=r"limits\.max_upload_bytes"):
                put_compressed(gw, "writer-token", bomb, "bomb-1")
            answered = time.monotonic()
        finally:
            done.set()
            reader.join(30)
        assert errors == []
        assert any(s < answered and e > sent for s, e, _ in spans), "no read overlapped the bomb"
        assert {rows for _, _, rows in spans} == {3}
        assert gw.state() == before  # no new version, no file written
        # The gateway keeps serving, uploads included.
        assert gw.c["writer"].put("t", pa.table({"id": [4]}))["rows"] == 1
        assert gw.ids() == [1, 2, 3, 4]


# ------------------------------------------- a batch the gateway cannot allocate memory for


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _flight_data(header: bytes, body: bytes = b"", command: bytes | None = None) -> bytes:
    """A Flight.proto ``FlightData`` (descriptor = 1, data_header = 2, data_body = 1000)."""
    out = b""
    if command is not None:  # FlightDescriptor{type = CMD (2), cmd = 2}
        out += _bytes_field(1, _varint(1 << 3) + _varint(2) + _bytes_field(2, command))
    out += _bytes_field(2, header)
    return out + (_bytes_field(1000, body) if body else b"")


def lying_batch(rows: int, declared: int) -> tuple[bytes, bytes, bytes]:
    """(schema header, batch header, batch body) of a zstd batch whose compressed buffer
    declares ``declared`` bytes once decompressed (the 8-byte prefix the IPC format puts first)."""
    sink = pa.BufferOutputStream()
    table = pa.table({"id": pa.array([0] * rows, pa.int64())})
    with pa.ipc.new_stream(sink, table.schema, options=ZSTD.write_options) as w:
        w.write_table(table)
    source = pa.BufferReader(sink.getvalue())
    schema, batch = pa.ipc.read_message(source), pa.ipc.read_message(source)
    body = batch.body.to_pybytes()
    at = body.index(struct.pack("<q", rows * 8))
    body = body[:at] + struct.pack("<q", declared) + body[at + 8 :]
    return schema.metadata.to_pybytes(), batch.metadata.to_pybytes(), body


def test_a_batch_that_cannot_be_allocated_is_resource_exhausted(tmp_path: Path) -> None:
    """Decoding allocates what a compressed buffer declares (here 64 PiB): the allocation fails
    inside Arrow (pa.ArrowMemoryError), which must reach the caller as RESOURCE_EXHAUSTED, not
    UNKNOWN/INTERNAL, and leave the gateway serving."""
    with gateway(tmp_path) as gw:
        before = gw.state()
        schema, header, body = lying_batch(1000, 1 << 56)
        command = json.dumps({"table": "t", "commit_id": "liar-1"}).encode()
        messages = [_flight_data(schema, command=command), _flight_data(header, body)]
        with grpc.insecure_channel(f"127.0.0.1:{gw.server.port}") as channel:
            do_put = channel.stream_stream(
                "/arrow.flight.protocol.FlightService/DoPut",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            with pytest.raises(grpc.RpcError) as failed:
                list(do_put(iter(messages), metadata=[("authorization", "Bearer writer-token")]))
        assert failed.value.details().startswith("[RESOURCE_EXHAUSTED] ")  # type: ignore[attr-defined]
        assert gw.state() == before
        assert gw.c["writer"].put("t", pa.table({"id": [4]}))["rows"] == 1


# ---------------------------------------------------------------- concurrent uploads


def test_concurrent_uploads_per_principal_are_bounded(tmp_path: Path) -> None:
    with gateway(tmp_path, max_uploads_per_principal=1) as gw:
        with held_upload(gw, "writer-token", "writer", "slow-1"):
            with pytest.raises(ResourceExhausted, match=r"limits\.max_uploads_per_principal"):
                gw.c["writer"].put("t", pa.table({"id": [10]}))
            assert gw.c["writer2"].put("t", pa.table({"id": [11]}))["rows"] == 1  # others can
            assert gw.c["reader"].read("t").num_rows == 4
        # The held upload finished and committed; its slot is free again.
        assert gw.c["writer"].put("t", pa.table({"id": [12]}))["rows"] == 1
        assert gw.ids() == [1, 2, 3, 11, 12, 100]


def test_a_client_retries_a_busy_refusal_until_a_slot_frees(tmp_path: Path) -> None:
    """RESOURCE_EXHAUSTED of kind busy means the call did nothing: the client backs off and
    sends it again, so a burst of writers over the limit all land once a slot frees."""
    with gateway(tmp_path, max_uploads_per_principal=1) as gw:
        patient = client_for(gw.server, token="writer-token", busy_wait_s=30)
        done: list[dict[str, Any]] = []
        with held_upload(gw, "writer-token", "writer", "slow-1"):
            waiting = threading.Thread(
                target=lambda: done.append(patient.put("t", pa.table({"id": [7]})))
            )
            waiting.start()
            time.sleep(0.5)
            assert waiting.is_alive() and not done  # refused, waiting for the slot
        waiting.join(30)
        assert done and done[0]["rows"] == 1
        patient.close()
        assert gw.ids() == [1, 2, 3, 7, 100]


def test_uploads_in_progress_are_bounded_gateway_wide(tmp_path: Path) -> None:
    with gateway(tmp_path, max_concurrent_uploads=1) as gw:
        with held_upload(gw, "writer-token", "writer", "slow-1"):
            with pytest.raises(ResourceExhausted, match=r"limits\.max_concurrent_uploads"):
                gw.c["writer2"].put("t", pa.table({"id": [11]}))
            assert gw.c["reader"].read("t").num_rows == 3  # reads are not uploads
        assert gw.c["writer2"].put("t", pa.table({"id": [11]}))["rows"] == 1
        assert gw.ids() == [1, 2, 3, 11, 100]


def test_upload_limits_must_be_positive() -> None:
    for name in ("max_uploads_per_principal", "max_concurrent_uploads"):
        assert GatewayConfig(limits={name: 2}).limit_values == Limits(**{name: 2})
        for bad in (0, -1, "4", True):
            with pytest.raises(ValueError, match=rf"limits\.{name} must be a positive integer"):
                GatewayConfig(limits={name: bad})
