"""Results of read planning, and what planning needs of the read service (``Pinning``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from flight_gateway.catalog import Catalog, TableSnapshot
from flight_gateway.core.context import Gateway
from flight_gateway.protocol.tickets import TicketPayload
from planners.kind import ScanTask


@dataclass(frozen=True)
class Endpoint:
    ticket: bytes
    expires_at: float
    task: ScanTask
    #: A signed direct task (``flight_gateway.protocol.direct``) when the client may read the
    #: task's files itself; the ticket stays valid either way.
    direct: str | None = None

    def app_metadata(self) -> bytes:
        return json.dumps({"direct": self.direct}).encode() if self.direct else b""


@dataclass(frozen=True)
class SourceReport:
    """How planning treated one source (in the FlightInfo's ``app_metadata``)."""

    name: str
    kind: str
    pruned: bool
    tasks: int

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "pruned": self.pruned, "tasks": self.tasks}


@dataclass(frozen=True)
class PlannedRead:
    snapshot: TableSnapshot
    schema: pa.Schema
    endpoints: list[Endpoint] = field(default_factory=list)
    sources: list[SourceReport] = field(default_factory=list)

    def app_metadata(self) -> bytes:
        return json.dumps(
            {
                "table": self.snapshot.table,
                "version": self.snapshot.version,
                "schema_id": self.snapshot.schema.schema_id,
                "sources": [s.to_json() for s in self.sources],
            }
        ).encode()


class Pinning(Protocol):
    """What the planners of a read (``plain``, ``dedupe``, ``since``) use of the read service:
    the context, pinned snapshots and endpoint signing (``service.ReadService`` is one)."""

    gw: Gateway
    catalog: Catalog
    direct: Any

    def snapshot(
        self,
        table: str,
        version: int | None = None,
        as_of: float | None = None,
        table_id: int | None = None,
    ) -> TableSnapshot: ...

    def endpoint(
        self, payload: TicketPayload, task: ScanTask, direct: str | None = None
    ) -> Endpoint: ...
