"""A Flight SQL statement command as bytes, without protobuf: what a thin client sends.

``statement(query)`` is ``Any{type_url: ".../CommandStatementQuery", value:
CommandStatementQuery{query}}`` serialized: two length-delimited fields each (field numbers 1 and
2 of ``Any``, 1 of the command), so the client needs no protobuf runtime (its import is 34
modules). ``tests/flightsql`` checks the bytes against protobuf's own serialization."""

from __future__ import annotations

STATEMENT_TYPE_URL = "type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, value: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def statement(query: str) -> bytes:
    """The serialized ``Any`` of ``CommandStatementQuery{query}`` (no transaction id)."""
    command = _field(1, query.encode()) if query else b""  # proto3 leaves out empty fields
    return _field(1, STATEMENT_TYPE_URL.encode()) + (_field(2, command) if command else b"")
