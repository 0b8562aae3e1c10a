"""The primary-key view (``dedupe: true``): the latest row per key across sources.

Co-partitioned by key (``partition_by`` within ``primary_key``), a key lives in one partition, so
each partition group is deduplicated on its own (one endpoint each); otherwise one endpoint over
the whole table. Only filter conjuncts on key columns are pushed below the dedupe, because every
version of a key shares its key values; the whole filter applies to the latest rows.
"""

from __future__ import annotations

import json

import pyarrow as pa

from flight_gateway.catalog import TableSnapshot
from flight_gateway.core.read.model import Pinning, PlannedRead, SourceReport
from flight_gateway.core.read.shape import arrow_schema, candidate_sources, column_specs, resolve
from flight_gateway.core.sources import bind, scan_request
from flight_gateway.protocol import ReadRequest, TicketPayload
from flight_gateway.protocol.errors import InvalidArgument, ResourceExhausted
from planners.dedupe import latest_per_key, with_rank
from planners.execute import execute
from planners.kind import ScanTask
from planners.predicates import Expr, columns, conjoin, conjuncts, to_arrow


def _groups(snap: TableSnapshot, names: set[str]) -> list[list[str]]:
    by_key = bool(snap.partition_by) and set(snap.partition_by) <= set(snap.primary_key)
    groups: dict[str, list[str]] = {}
    for s in snap.sources:
        if s.name in names:
            key = json.dumps(dict(s.partition), sort_keys=True) if by_key and s.partition else "*"
            groups.setdefault(key, []).append(s.name)
    if "*" in groups and len(groups) > 1:  # a source without partition values spans every key
        return [[n for g in groups.values() for n in g]]
    return list(groups.values())


def plan(svc: Pinning, snap: TableSnapshot, req: ReadRequest, principal: str | None) -> PlannedRead:
    if not snap.primary_key:
        raise InvalidArgument(f"dedupe needs a primary_key; table {snap.table!r} has none")
    shape = resolve(snap, req.columns, req.filter)
    names = candidate_sources(snap, req, shape.predicate)
    out = PlannedRead(snap, arrow_schema(snap.schema, shape.projection))
    out.sources.extend(
        SourceReport(s.name, s.kind, pruned=s.name not in names, tasks=int(s.name in names))
        for s in snap.sources
    )
    for group in _groups(snap, names):
        payload = TicketPayload(
            table=snap.table,
            version=snap.version,
            table_id=snap.table_id,
            columns=tuple(shape.projection),
            filter=req.filter,
            limit=req.limit,
            dedupe_sources=tuple(group),
            principal=principal,
        )
        out.endpoints.append(svc.endpoint(payload, ScanTask("*", {"sources": group})))
    return out


def _read_columns(
    snap: TableSnapshot, projection: list[str], predicate: Expr | None
) -> tuple[list[str], Expr | None]:
    """Columns to read (projection, keys, filter, ordering, tombstone) and the part of the filter
    that may be pushed below the dedupe (conjuncts on key columns only)."""
    keys = list(snap.primary_key)
    order_by = snap.properties.get("dedupe.order_by")
    extra = [*keys, *(sorted(columns(predicate)) if predicate else [])]
    extra += [c for c in (order_by, "_deleted") if c and c in snap.schema.names]
    read = list(dict.fromkeys([*projection, *extra]))
    pushable = [c for c in conjuncts(predicate) if columns(c) <= set(keys)]
    return read, conjoin(pushable)


def open(svc: Pinning, snap: TableSnapshot, payload: TicketPayload) -> pa.RecordBatchReader:
    shape = resolve(snap, payload.columns, payload.filter)
    read, pushable = _read_columns(snap, shape.projection, shape.predicate)
    specs = column_specs(snap, read)
    order_by = snap.properties.get("dedupe.order_by")
    parts, rows = [], 0
    for name in payload.dedupe_sources or ():
        kind, ref = bind(svc.gw, snap, name)
        request = scan_request(svc.gw, snap.table, ref, specs, pushable, None)
        # Tasks come in source order (file list, offsets): rank the source as one stream.
        pieces = []
        for t in kind.plan(request):
            reader = execute(kind, request, t, read)
            for batch in reader:  # counted batch by batch: the bound holds within a task too
                rows += batch.num_rows
                if rows > svc.gw.limits.max_dedupe_rows:
                    raise ResourceExhausted(
                        f"the primary-key view of {snap.table!r} would hold more than "
                        f"{svc.gw.limits.max_dedupe_rows} rows in one endpoint "
                        "(limits.max_dedupe_rows): partition the table by its key, or filter "
                        "on it"
                    )
                pieces.append(pa.Table.from_batches([batch], schema=reader.schema))
        if pieces:
            parts.append(with_rank(pa.concat_tables(pieces), kind.tier(ref), 0, order_by))
    if not parts:
        return pa.RecordBatchReader.from_batches(
            arrow_schema(snap.schema, shape.projection), iter(())
        )
    data = latest_per_key(parts, snap.primary_key)
    if shape.predicate is not None:
        data = data.filter(to_arrow(shape.predicate, data.schema))
    data = data.select(shape.projection)
    if payload.limit is not None:
        data = data.slice(0, int(payload.limit))
    return pa.RecordBatchReader.from_batches(data.schema, data.to_batches(max_chunksize=64 * 1024))
