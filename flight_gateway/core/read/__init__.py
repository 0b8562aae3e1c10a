"""The read path: protocol -> ``ReadService`` (pinning, tickets) -> planning (``plain``,
``dedupe``, ``since``) -> source kind -> ``planners.execute`` (residual, projection, limit)."""

from flight_gateway.core.read.model import Endpoint, PlannedRead, SourceReport
from flight_gateway.core.read.service import ReadService
from flight_gateway.core.read.shape import arrow_schema

__all__ = ["Endpoint", "PlannedRead", "ReadService", "SourceReport", "arrow_schema"]
