"""Wire protocol: read descriptors, tickets, action names and bodies, error codes.

Knows nothing below it (no catalog, no planners). See docs/protocol.md.
"""

from flight_gateway.protocol.errors import from_flight_error, to_flight_error
from flight_gateway.protocol.messages import ACTIONS, PROTOCOL_VERSION, ReadRequest, decode_json
from flight_gateway.protocol.tickets import TicketSigner

__all__ = [
    "ACTIONS",
    "PROTOCOL_VERSION",
    "ReadRequest",
    "TicketSigner",
    "decode_json",
    "from_flight_error",
    "to_flight_error",
]
