"""Added rows (``since``): only the rows the commits ``since+1 … version`` added.

Each source's kind says what its state change added (``planners.kind.Streams``). Commits that
relocate rows (movers, compaction: ``operations.is_relocation``) add none, so a row is delivered
once, when it is first written, wherever it lives later. Kinds whose additions are cumulative
(Kafka offsets) are asked once for the whole range; the others commit by commit, skipping
relocations. A source added after ``since`` contributes every row it had when it was added.
Each task is served at the version it was planned at.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flight_gateway.catalog import TableSnapshot
from flight_gateway.core.read.model import Pinning, PlannedRead, SourceReport
from flight_gateway.core.read.shape import ReadShape, arrow_schema, resolve
from flight_gateway.core.sources import bind, scan_request
from flight_gateway.protocol import ReadRequest, TicketPayload
from flight_gateway.protocol.errors import InvalidArgument, ResourceExhausted
from flight_gateway.protocol.operations import is_relocation
from planners.kind import ScanRequest, ScanTask, SourceKind, Streams

#: (version the task is served at, source, task)
Planned = list[tuple[int, str, ScanTask]]


class _Delta:
    def __init__(self, svc: Pinning, end: TableSnapshot, since: int, shape: ReadShape) -> None:
        self.svc, self.end, self.since, self.shape = svc, end, since, shape
        # The commits since+1 .. end.version: a read at an older version must not take the
        # newest commits of the table instead.
        history = svc.catalog.history(end.table, limit=end.version - since, until=end.version)
        self.summaries: dict[int, Mapping[str, Any]] = {c.version: c.summary for c in history}

    def _request(self, snap: TableSnapshot, name: str) -> tuple[SourceKind, ScanRequest]:
        kind, ref = bind(self.svc.gw, snap, name)
        limit = self.svc.gw.limits.max_tasks
        return kind, scan_request(
            self.svc.gw, snap.table, ref, self.shape.specs, self.shape.predicate, None, limit
        )

    def _plan(self, snap: TableSnapshot, name: str) -> list[ScanTask]:
        kind, request = self._request(snap, name)
        return kind.plan(request)

    def _changes(self, name: str, first: int) -> list[int]:
        """Versions after ``first`` whose commit set the source's state."""
        return [
            v
            for v in range(first + 1, self.end.version + 1)
            if name in self.summaries.get(v, {}).get("updated", ())
        ]

    def source(self, name: str, start: TableSnapshot) -> Planned:
        out: Planned = []
        s = self.end.source(name)
        existed = any(x.name == name for x in start.sources)
        first = self.since if existed else s.added_version
        base = (
            start
            if existed
            else self.svc.snapshot(self.end.table, first, table_id=self.end.table_id)
        )
        kind: SourceKind = self._request(base, name)[0]
        changes = self._changes(name, first)
        if not isinstance(kind, Streams):
            touched = [v for v in changes if not is_relocation(self.summaries[v])]
            if touched or not existed:
                raise InvalidArgument(
                    f"streaming reads need sources whose kind reports added rows; {name!r} is "
                    f"{s.kind} and changed at version {(touched or [first])[0]}"
                )
            return out
        if not existed:  # every row it had when it was added
            out += [(first, name, t) for t in self._plan(base, name)]
        before = base.source(name).state
        if kind.cumulative:
            _, request = self._request(self.end, name)
            return out + [(self.end.version, name, t) for t in kind.plan_added(request, before)]
        for v in changes:
            snap = self.svc.snapshot(self.end.table, v, table_id=self.end.table_id)
            if not is_relocation(self.summaries[v]):
                _, request = self._request(snap, name)
                out += [(v, name, t) for t in kind.plan_added(request, before)]
            before = snap.source(name).state
        return out


def plan(svc: Pinning, end: TableSnapshot, req: ReadRequest, principal: str | None) -> PlannedRead:
    since = int(req.since or 0)
    if end.version - since > svc.gw.limits.max_since_versions:
        raise ResourceExhausted(
            f"since {since} is {end.version - since} versions behind {end.version}, more than "
            f"the gateway's limit of {svc.gw.limits.max_since_versions}: read the table at a "
            "version, then stream from there"
        )
    shape = resolve(end, req.columns, req.filter)
    for name in req.sources or ():
        end.source(name)
    planned: Planned = []
    if since < end.version:
        delta, start = (
            _Delta(svc, end, since, shape),
            svc.snapshot(end.table, since, table_id=end.table_id),
        )
        for s in end.sources:
            if req.sources is None or s.name in req.sources:
                planned += delta.source(s.name, start)
    out = PlannedRead(end, arrow_schema(end.schema, shape.projection))
    if len(planned) > svc.gw.limits.max_tasks:
        raise InvalidArgument(
            f"the rows added since {since} are {len(planned)} tasks, more than the gateway's "
            f"limit of {svc.gw.limits.max_tasks}: stream in smaller steps"
        )
    for version, name, task in planned:
        payload = TicketPayload(
            table=end.table,
            version=version,
            table_id=end.table_id,
            columns=tuple(shape.projection),
            filter=req.filter,
            source=name,
            task=task.payload,
            exact=task.exact_filter,
            principal=principal,
        )
        out.endpoints.append(svc.endpoint(payload, task))
    for s in end.sources:
        n = sum(1 for _, name, _ in planned if name == s.name)
        out.sources.append(SourceReport(s.name, s.kind, pruned=False, tasks=n))
    return out
