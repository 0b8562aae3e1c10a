"""Cancelling statements: Flight's ``CancelFlightInfo`` action and Flight SQL's older
``CancelQuery``, both naming the ``FlightInfo`` GetFlightInfo returned.

A statement's ticket carries its sealed handle; the statements running under that handle are
interrupted (their worker stops the DuckDB query, the stream ends with CANCELLED and its slots
are released as the stream ends), and the handle is remembered as cancelled until it expires,
so a DoGet that had not started yet, or starts later, fails with CANCELLED instead of running.
Only the principal a statement was issued to may cancel it (the handle says who).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from flight_gateway.faces.flightsql.workers import Execution
from flight_gateway.protocol.errors import Cancelled, InvalidArgument
from flight_gateway.protocol.flightsql import pack, pb, unpack

#: Flight's ``CancelStatus`` (Flight.proto) and Flight SQL's ``CancelResult``: same numbers.
CANCELLED, NOT_CANCELLABLE = 1, 3
ACTIONS = frozenset({"CancelFlightInfo", "CancelQuery"})


class Running:
    """The statements running under each sealed handle, and the handles cancelled."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._running: dict[bytes, set[Execution]] = {}
        self._cancelled: dict[bytes, float] = {}

    def check(self, key: bytes) -> None:
        """CANCELLED when the statement of ``key`` was cancelled."""
        with self._lock:
            until = self._cancelled.get(key)
        if until is not None and until > time.monotonic():
            raise Cancelled("the statement was cancelled")

    def stream(self, key: bytes, ex: Execution) -> Any:
        """``ex.stream()``, cancellable by ``key`` from before its first batch (a statement
        may compute for a long time before it has one) until it ends."""
        with self._lock:
            self._running.setdefault(key, set()).add(ex)
            cancelled = self._cancelled.get(key, 0.0) > time.monotonic()
        if cancelled:  # cancelled while it was being planned
            ex.cancel()
        try:
            stream = ex.stream()
        except BaseException:
            self._forget(key, ex)
            raise

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                yield from stream
            finally:
                self._forget(key, ex)

        return pa.RecordBatchReader.from_batches(stream.schema, batches())

    def _forget(self, key: bytes, ex: Execution) -> None:
        with self._lock:
            running = self._running.get(key)
            if running is not None:
                running.discard(ex)
                if not running:
                    del self._running[key]

    def cancel(self, key: bytes) -> int:
        """Cancel the statement of ``key``: stop what runs, refuse what comes."""
        now = time.monotonic()
        with self._lock:
            self._cancelled = {k: t for k, t in self._cancelled.items() if t > now}
            self._cancelled[key] = now + self.ttl_s
            running = list(self._running.get(key, ()))
        for ex in running:
            ex.cancel()
        return CANCELLED


def _field_one(body: bytes) -> bytes:
    """Field 1 (length-delimited) of a protobuf message: ``CancelFlightInfoRequest.info``."""
    pos, out = 0, b""
    while pos < len(body):
        tag, pos = _varint(body, pos)
        if tag & 7 != 2:
            raise InvalidArgument("CancelFlightInfo needs a CancelFlightInfoRequest")
        size, pos = _varint(body, pos)
        if tag >> 3 == 1:
            out = body[pos : pos + size]
        pos += size
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise InvalidArgument("a truncated protobuf message")


def statement_handles(action_type: str, body: bytes) -> list[bytes]:
    """The sealed statement handles of the tickets of the FlightInfo an action names."""
    if action_type == "CancelQuery":
        request = unpack(body)
        if not isinstance(request, pb.ActionCancelQueryRequest):
            raise InvalidArgument("CancelQuery needs an ActionCancelQueryRequest")
        raw = request.info
    else:
        raw = _field_one(body)
    try:
        info = fl.FlightInfo.deserialize(raw)
    except (pa.ArrowException, TypeError, ValueError) as e:
        raise InvalidArgument(f"{action_type} needs the FlightInfo to cancel: {e}") from None
    handles = []
    for endpoint in info.endpoints:
        message = unpack(endpoint.ticket.ticket)
        if isinstance(message, pb.TicketStatementQuery):
            handles.append(bytes(message.statement_handle))
    return handles


def result(action_type: str, status: int) -> bytes:
    if action_type == "CancelQuery":
        return pack(pb.ActionCancelQueryResult(result=status))
    return bytes([0x08, status])  # CancelFlightInfoResult{status}
