"""Wire protocol: read descriptors, tickets, action names and bodies, typed results, errors.

Knows nothing below it (no catalog, no planners). See docs/protocol.md.
"""

from flight_gateway.protocol.describe import CommitRecord, FieldInfo, SourceInfo, TableInfo
from flight_gateway.protocol.errors import from_flight_error, to_flight_error
from flight_gateway.protocol.messages import ACTIONS, PROTOCOL_VERSION, ReadRequest, decode_json
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
    "from_flight_error",
    "to_flight_error",
]
