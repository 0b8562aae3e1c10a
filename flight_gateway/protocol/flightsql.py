"""Arrow Flight SQL messages: the generated protobuf classes (``pb``) and their packing in
``google.protobuf.Any`` as Flight SQL carries them in descriptors, tickets and action bodies.
The client packs statements with it; the gateway's Flight SQL face unpacks them."""

from __future__ import annotations

from typing import Any

from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

from flight_gateway.protocol.errors import InvalidArgument
from flight_gateway.protocol.proto import FlightSql_pb2

pb: Any = FlightSql_pb2  # generated classes, untyped
TYPE_PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."


def unpack(data: bytes) -> Any | None:
    """The Flight SQL message in ``data``, or None when it is not one (a native command)."""
    if not data or data[:1] in (b"{", b"h"):
        return None
    wrapper = any_pb2.Any()
    try:
        wrapper.ParseFromString(data)
    except DecodeError:
        return None
    if not wrapper.type_url.startswith(TYPE_PREFIX):
        return None
    name = wrapper.type_url[len(TYPE_PREFIX) :]
    cls = getattr(pb, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Message)):  # DESCRIPTOR, an enum, ...
        raise NotImplementedError(f"Flight SQL command {name[:100]!r} is not supported")
    message = cls()
    try:
        wrapper.Unpack(message)
    except DecodeError as e:
        raise InvalidArgument(f"malformed Flight SQL command {name}: {e}") from None
    return message


def is_statement(message: Any) -> bool:
    """True for the ticket of a statement's result (planned and run by DuckDB)."""
    return isinstance(message, pb.TicketStatementQuery)


def pack(message: Any) -> bytes:
    wrapper = any_pb2.Any()
    wrapper.Pack(message, type_url_prefix="type.googleapis.com/")
    return bytes(wrapper.SerializeToString())
