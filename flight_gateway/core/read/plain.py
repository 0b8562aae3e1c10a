"""Plain reads: every unpruned source planned by its kind, one endpoint per task."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from flight_gateway.catalog import TableSnapshot
from flight_gateway.core import tracing
from flight_gateway.core.context import Gateway
from flight_gateway.core.read.direct import direct_token
from flight_gateway.core.read.model import Pinning, PlannedRead, SourceReport
from flight_gateway.core.read.shape import ReadShape, arrow_schema, candidate_sources, resolve
from flight_gateway.core.sources import bind, scan_request
from flight_gateway.protocol import ReadRequest, TicketPayload
from planners.kind import ScanRequest, ScanTask, SourceKind

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourcePlan:
    """One source of a read: pruned by the filter (``kind`` None), or its kind's tasks."""

    name: str
    kind_name: str
    kind: SourceKind | None = None
    request: ScanRequest | None = None
    tasks: list[ScanTask] = field(default_factory=list)


def plan_sources(
    gw: Gateway, snap: TableSnapshot, req: ReadRequest, shape: ReadShape
) -> Iterator[SourcePlan]:
    """Each source of ``snap`` planned by its kind (after the policies allowed it), or pruned;
    all of them together within ``limits.max_tasks``."""
    open_sources = candidate_sources(snap, req, shape.predicate)
    planned = 0
    for s in snap.sources:
        if s.name not in open_sources:
            yield SourcePlan(s.name, s.kind)
            continue
        kind, ref = bind(gw, snap, s.name)
        left = gw.limits.max_tasks - planned
        request = scan_request(gw, snap.table, ref, shape.specs, shape.predicate, req.limit, left)
        with tracing.span("plan.source", source=s.name, kind=s.kind) as sp:
            tasks = kind.plan(request)
            if sp is not None:
                sp.set_attribute("tasks", len(tasks))
        request.check_task_count(len(tasks))
        planned += len(tasks)
        yield SourcePlan(s.name, s.kind, kind, request, tasks)


def plan(svc: Pinning, snap: TableSnapshot, req: ReadRequest, principal: str | None) -> PlannedRead:
    shape = resolve(snap, req.columns, req.filter)
    out = PlannedRead(snap, arrow_schema(snap.schema, shape.projection))
    for sp in plan_sources(svc.gw, snap, req, shape):
        if sp.kind is None or sp.request is None:
            out.sources.append(SourceReport(sp.name, sp.kind_name, pruned=True, tasks=0))
            continue
        kind, request, tasks = sp.kind, sp.request, sp.tasks
        out.sources.append(SourceReport(sp.name, sp.kind_name, pruned=False, tasks=len(tasks)))
        for task in tasks:
            payload = TicketPayload(
                table=snap.table,
                version=snap.version,
                table_id=snap.table_id,
                columns=tuple(shape.projection),
                filter=req.filter,
                limit=req.limit,
                source=sp.name,
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
