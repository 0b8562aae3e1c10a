"""The read path: pin a version, plan (plain, primary-key view or added rows), sign tickets;
serve a ticket.

Everything a ticket needs to be served again is in its signed payload or in the catalog at its
pinned version, so any replica sharing the catalog and the ticket key can serve it.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict

import pyarrow as pa

from flight_gateway import tracing
from flight_gateway.catalog import TableSnapshot
from flight_gateway.errors import HarnessError, Unauthorized
from flight_gateway.protocol import ReadRequest, TicketPayload, TicketSigner
from flight_gateway.protocol.direct import DirectSigner
from flight_gateway.server import metrics
from flight_gateway.server.context import Gateway
from flight_gateway.server.read import dedupe, plain, since
from flight_gateway.server.read.model import Endpoint, PlannedRead
from flight_gateway.server.read.shape import arrow_schema, resolve
from flight_gateway.server.sources import bind, scan_request
from planners.execute import execute
from planners.kind import ScanTask


class ReadService:
    def __init__(
        self,
        gw: Gateway,
        signer: TicketSigner,
        snapshot_ttl_s: float = 30.0,
        direct: DirectSigner | None = None,
    ) -> None:
        self.gw = gw
        self.catalog = gw.catalog
        self.signer = signer
        self.direct = direct or DirectSigner(secrets.token_bytes(32), signer.ttl_s)
        self._ttl = snapshot_ttl_s
        self._cache: OrderedDict[tuple[str, int], tuple[float, TableSnapshot]] = OrderedDict()
        self._lock = threading.Lock()

    # A pinned version never changes, so DoGet calls for it can share one catalog lookup.
    def snapshot(
        self, table: str, version: int | None = None, as_of: float | None = None
    ) -> TableSnapshot:
        if version is None and as_of is None:
            # The current version is one primary-key lookup; its snapshot is then cached like
            # any pinned version, so describe runs once per new version, not once per read.
            version = self.catalog.current_version(table)
        if version is not None:
            with self._lock:
                hit = self._cache.get((table, version))
                if hit is not None and time.monotonic() - hit[0] < self._ttl:
                    return hit[1]
        snap = self.catalog.describe(table, version=version, as_of=as_of)
        with self._lock:
            self._cache[(table, snap.version)] = (time.monotonic(), snap)
            while len(self._cache) > 128:  # each snapshot holds every source state
                self._cache.popitem(last=False)
        return snap

    def schema_for(self, req: ReadRequest) -> tuple[TableSnapshot, pa.Schema]:
        snap = self.snapshot(req.table, req.version, req.as_of)
        return snap, arrow_schema(snap.schema, resolve(snap, req.columns, req.filter).projection)

    def endpoint(
        self, payload: TicketPayload, task: ScanTask, direct: str | None = None
    ) -> Endpoint:
        ticket, expires = self.signer.sign(payload)
        return Endpoint(ticket, expires, task, direct)

    def plan(self, req: ReadRequest, principal: str | None = None) -> PlannedRead:
        with tracing.span("pin", table=req.table) as s:
            snap = self.snapshot(req.table, req.version, req.as_of)
            if s is not None:
                s.set_attribute("version", snap.version)
        with tracing.span("plan", table=req.table, version=snap.version):
            if req.dedupe:
                return dedupe.plan(self, snap, req, principal)
            if req.since is not None:
                return since.plan(self, snap, req, principal)
            return plain.plan(self, snap, req, principal)

    def verify(self, ticket: bytes, principal: str) -> TicketPayload:
        try:
            payload = self.signer.verify(ticket)
        except HarnessError:
            metrics.TICKETS_REJECTED.labels("invalid_or_expired").inc()
            raise
        if payload.principal is not None and payload.principal != principal:
            metrics.TICKETS_REJECTED.labels("other_principal").inc()
            raise Unauthorized("this ticket was issued to another principal")
        return payload

    def open(self, payload: TicketPayload) -> pa.RecordBatchReader:
        """The stream of one verified ticket."""
        snap = self.snapshot(payload.table, payload.version)
        if payload.dedupe_sources is not None:
            return metrics.counted(dedupe.open(self, snap, payload), payload.table, "dedupe")
        shape = resolve(snap, payload.columns, payload.filter)
        kind, ref = bind(self.gw, snap, str(payload.source))
        request = scan_request(self.gw, ref, shape.specs, shape.predicate, payload.limit)
        task = ScanTask(ref.name, payload.task, payload.exact)
        reader = execute(kind, request, task, shape.projection)
        reader = tracing.traced_stream("scan", reader, source=ref.name, kind=ref.kind)
        return metrics.counted(reader, payload.table, ref.kind)
