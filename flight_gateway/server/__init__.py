"""Flight server: handlers, auth middleware, read planning. Imports protocol, catalog, planners."""

from flight_gateway.server.config import GatewayConfig
from flight_gateway.server.server import HarnessFlightServer

__all__ = ["GatewayConfig", "HarnessFlightServer"]
