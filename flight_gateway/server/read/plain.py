"""Plain reads: every unpruned source planned by its kind, one endpoint per task."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from flight_gateway.catalog import TableSnapshot
from flight_gateway.protocol import ReadRequest, TicketPayload
from flight_gateway.server.read.direct import direct_token
from flight_gateway.server.read.model import PlannedRead, SourceReport
from flight_gateway.server.read.shape import arrow_schema, candidate_sources, resolve
from flight_gateway.server.sources import bind, scan_request

if TYPE_CHECKING:
    from flight_gateway.server.read.service import ReadService

log = logging.getLogger(__name__)


def plan(
    svc: ReadService, snap: TableSnapshot, req: ReadRequest, principal: str | None
) -> PlannedRead:
    shape = resolve(snap, req.columns, req.filter)
    open_sources = candidate_sources(snap, req, shape.predicate)
    out = PlannedRead(snap, arrow_schema(snap.schema, shape.projection))
    for s in snap.sources:
        if s.name not in open_sources:
            out.sources.append(SourceReport(s.name, s.kind, pruned=True, tasks=0))
            continue
        kind, ref = bind(svc.gw, snap, s.name)
        left = svc.gw.limits.max_tasks - len(out.endpoints)
        request = scan_request(svc.gw, ref, shape.specs, shape.predicate, req.limit, left)
        tasks = kind.plan(request)
        request.check_task_count(len(tasks))
        out.sources.append(SourceReport(s.name, s.kind, pruned=False, tasks=len(tasks)))
        for task in tasks:
            payload = TicketPayload(
                table=snap.table,
                version=snap.version,
                columns=tuple(shape.projection),
                filter=req.filter,
                limit=req.limit,
                source=s.name,
                task=task.payload,
                exact=task.exact_filter,
                principal=principal,
            )
            direct = None
            if req.direct:
                pin = (snap.table, snap.version)
                direct = direct_token(
                    svc.direct, kind, request, task, shape, req.filter, pin, principal
                )
            out.endpoints.append(svc.endpoint(payload, task, direct))
    log.info(
        "planned %s@%d: %d endpoints, %d/%d sources pruned",
        snap.table,
        snap.version,
        len(out.endpoints),
        sum(s.pruned for s in out.sources),
        len(out.sources),
    )
    return out
