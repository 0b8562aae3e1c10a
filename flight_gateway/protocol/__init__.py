"""Wire protocol: read descriptors, tickets, action names and bodies, typed results, errors.

The bottom layer of the project: imports nothing of it (no catalog, no planners, no core), only
pyarrow and protobuf, and those lazily where a module's callers may not need them (the error
tree, ``errors``, imports neither; the Flight mapping of errors is ``flight_errors``). See
docs/protocol.md.
"""

from flight_gateway.protocol.actions import ACTIONS
from flight_gateway.protocol.describe import CommitRecord, FieldInfo, SourceInfo, TableInfo
from flight_gateway.protocol.messages import PROTOCOL_VERSION, ReadRequest, decode_json
from flight_gateway.protocol.tickets import TICKET_VERSION, TicketPayload, TicketSigner

__all__ = [
    "ACTIONS",
    "PROTOCOL_VERSION",
    "TICKET_VERSION",
    "CommitRecord",
    "FieldInfo",
    "ReadRequest",
    "SourceInfo",
    "TableInfo",
    "TicketPayload",
    "TicketSigner",
    "decode_json",
]
