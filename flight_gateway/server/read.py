"""The read path: pin a version, prune sources, plan tasks, sign tickets; serve a ticket.

Everything a ticket needs to be served again is in its signed payload (table, pinned version,
source name, the planner's task payload, projection, filter, limit) or in the catalog at that
version, so any replica sharing the catalog and the ticket key can serve it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flight_gateway.arrow_types import parse_type
from flight_gateway.catalog import Catalog, TableSnapshot
from flight_gateway.catalog.config import resolve_config
from flight_gateway.catalog.schema import Schema
from flight_gateway.errors import InvalidArgument
from flight_gateway.protocol import ReadRequest, TicketSigner
from planners.base import ColumnSpec, ScanRequest, ScanTask, SourceRef
from planners.predicates import Expr, can_match, columns, conjoin, conjuncts, parse_filter
from planners.registry import get_planner
from planners.scan import execute

log = logging.getLogger(__name__)
TICKET_VERSION = 1
#: Commit operations that move or rewrite rows without adding any (skipped by streaming).
RELOCATIONS = frozenset(
    {
        "compaction",
        "kafka-to-iceberg",
        "kafka-to-postgres",
        "postgres-to-iceberg",
        "postgres-to-ducklake",
        "kafka-flush",
        "pg-cold-move",
    }
)


def arrow_schema(schema: Schema, names: Sequence[str] | None = None) -> pa.Schema:
    """The Arrow schema of ``names`` (all columns when None); every field nullable."""
    fields = schema.fields if names is None else [schema.field(n) for n in names]
    return pa.schema([pa.field(f.name, parse_type(f.type), nullable=True) for f in fields])


@dataclass(frozen=True)
class Endpoint:
    task: ScanTask
    ticket: bytes
    expires_at: float


@dataclass(frozen=True)
class PlannedRead:
    snapshot: TableSnapshot
    schema: pa.Schema
    endpoints: list[Endpoint]
    sources: list[dict[str, Any]]

    def app_metadata(self) -> bytes:
        return json.dumps(
            {
                "table": self.snapshot.table,
                "version": self.snapshot.version,
                "schema_id": self.snapshot.schema.schema_id,
                "sources": self.sources,
            }
        ).encode()


class ReadService:
    def __init__(
        self, catalog: Catalog, signer: TicketSigner, snapshot_ttl_s: float = 30.0
    ) -> None:
        self.catalog = catalog
        self.signer = signer
        self._ttl = snapshot_ttl_s
        self._cache: OrderedDict[tuple[str, int], tuple[float, TableSnapshot]] = OrderedDict()
        self._lock = threading.Lock()

    # A pinned version never changes, so DoGet calls for it can share one catalog lookup.
    def snapshot(
        self, table: str, version: int | None = None, as_of: float | None = None
    ) -> TableSnapshot:
        if version is not None:
            with self._lock:
                hit = self._cache.get((table, version))
                if hit is not None and time.monotonic() - hit[0] < self._ttl:
                    return hit[1]
        snap = self.catalog.describe(table, version=version, as_of=as_of)
        with self._lock:
            self._cache[(table, snap.version)] = (time.monotonic(), snap)
            while len(self._cache) > 1024:
                self._cache.popitem(last=False)
        return snap

    def _resolve(
        self, snap: TableSnapshot, cols: Sequence[str] | None, flt: str | None
    ) -> tuple[list[str], Expr | None, tuple[ColumnSpec, ...]]:
        names = snap.schema.names
        projection = list(cols) if cols is not None else names
        unknown = [c for c in projection if c not in names]
        if unknown:
            raise InvalidArgument(
                f"unknown column(s) {unknown} in table {snap.table!r} (columns: {names})"
            )
        predicate = parse_filter(flt, arrow_schema(snap.schema))
        needed = (
            projection + sorted(columns(predicate) - set(projection)) if predicate else projection
        )
        specs = tuple(
            ColumnSpec(f.id, f.name, f.type, f.aliases)
            for f in (snap.schema.field(n) for n in needed)
        )
        return projection, predicate, specs

    @staticmethod
    def _scan_request(
        snap: TableSnapshot,
        source_name: str,
        specs: tuple[ColumnSpec, ...],
        predicate: Expr | None,
        limit: int | None,
        state: dict[str, Any] | None = None,
    ) -> ScanRequest:
        s = snap.source(source_name)
        config = resolve_config(s.config, where=f"source {s.name!r} config")
        ref = SourceRef(
            s.name, s.kind, config, s.partition, state if state is not None else s.state
        )
        return ScanRequest(ref, specs, predicate, limit)

    def schema_for(self, req: ReadRequest) -> tuple[TableSnapshot, pa.Schema]:
        snap = self.snapshot(req.table, req.version, req.as_of)
        projection, _, _ = self._resolve(snap, req.columns, req.filter)
        return snap, arrow_schema(snap.schema, projection)

    @staticmethod
    def _selected(snap: TableSnapshot, req: ReadRequest) -> set[str] | None:
        if req.sources is None:
            return None
        for name in req.sources:
            snap.source(name)  # NotFound names the unknown source
        return set(req.sources)

    def plan(self, req: ReadRequest) -> PlannedRead:
        snap = self.snapshot(req.table, req.version, req.as_of)
        if req.dedupe:
            return self._plan_dedupe(snap, req)
        if req.since is not None:
            return self._plan_delta(snap, req)
        projection, predicate, specs = self._resolve(snap, req.columns, req.filter)
        full = arrow_schema(snap.schema)
        endpoints: list[Endpoint] = []
        sources: list[dict[str, Any]] = []
        selected = self._selected(snap, req)
        for s in snap.sources:
            if (selected is not None and s.name not in selected) or not can_match(
                predicate, s.partition, full
            ):
                sources.append({"name": s.name, "kind": s.kind, "pruned": True, "tasks": 0})
                continue
            request = self._scan_request(snap, s.name, specs, predicate, req.limit)
            tasks = get_planner(s.kind).plan(request)
            sources.append({"name": s.name, "kind": s.kind, "pruned": False, "tasks": len(tasks)})
            for task in tasks:
                ticket, expires = self.signer.sign(
                    {
                        "v": TICKET_VERSION,
                        "table": snap.table,
                        "version": snap.version,
                        "source": s.name,
                        "kind": s.kind,
                        "task": dict(task.payload),
                        "exact": task.exact_filter,
                        "columns": projection,
                        "filter": req.filter,
                        "limit": req.limit,
                    }
                )
                endpoints.append(Endpoint(task, ticket, expires))
        log.info(
            "planned %s@%d: %d endpoints, %d/%d sources pruned",
            snap.table,
            snap.version,
            len(endpoints),
            sum(s["pruned"] for s in sources),
            len(sources),
        )
        return PlannedRead(snap, arrow_schema(snap.schema, projection), endpoints, sources)

    # ------------------------------------------------------------------ primary-key view

    def _dedupe_columns(
        self, snap: TableSnapshot, projection: list[str], predicate: Expr | None
    ) -> tuple[list[str], Expr | None]:
        """Columns to read (projection, keys, filter, ordering, tombstone) and the part of the
        filter that may be pushed below the dedupe: conjuncts on key columns only, because
        every version of a key shares its key values."""
        keys = list(snap.primary_key)
        order_by = snap.properties.get("dedupe.order_by")
        extra = [*keys, *(sorted(columns(predicate)) if predicate else [])]
        extra += [c for c in (order_by, "_deleted") if c and c in snap.schema.names]
        read = list(dict.fromkeys([*projection, *extra]))
        pushable = [c for c in conjuncts(predicate) if columns(c) <= set(keys)]
        return read, conjoin(pushable)

    def _plan_dedupe(self, snap: TableSnapshot, req: ReadRequest) -> PlannedRead:
        if not snap.primary_key:
            raise InvalidArgument(f"dedupe needs a primary_key; table {snap.table!r} has none")
        projection, predicate, _ = self._resolve(snap, req.columns, req.filter)
        full = arrow_schema(snap.schema)
        # Co-partitioned by key: a key lives in one partition, so each partition group is
        # deduplicated on its own (one task each). Otherwise one task over the whole table.
        by_key = bool(snap.partition_by) and set(snap.partition_by) <= set(snap.primary_key)
        groups: dict[str, list[str]] = {}
        sources: list[dict[str, Any]] = []
        selected = self._selected(snap, req)
        for s in snap.sources:
            if (selected is not None and s.name not in selected) or not can_match(
                predicate, s.partition, full
            ):
                sources.append({"name": s.name, "kind": s.kind, "pruned": True, "tasks": 0})
                continue
            sources.append({"name": s.name, "kind": s.kind, "pruned": False, "tasks": 1})
            group = json.dumps(dict(s.partition), sort_keys=True) if by_key and s.partition else "*"
            groups.setdefault(group, []).append(s.name)
        if by_key and "*" in groups and len(groups) > 1:
            groups = {
                "*": [n for g in groups.values() for n in g]
            }  # a source without partition values spans every key
        endpoints = []
        for names in groups.values():
            ticket, expires = self.signer.sign(
                {
                    "v": TICKET_VERSION,
                    "table": snap.table,
                    "version": snap.version,
                    "dedupe": True,
                    "sources": names,
                    "columns": projection,
                    "filter": req.filter,
                    "limit": req.limit,
                }
            )
            endpoints.append(Endpoint(ScanTask("*", "dedupe", {"sources": names}), ticket, expires))
        return PlannedRead(snap, arrow_schema(snap.schema, projection), endpoints, sources)

    def _open_dedupe(self, snap: TableSnapshot, payload: dict[str, Any]) -> pa.RecordBatchReader:
        from planners.dedupe import DEFAULT_TIERS, latest_per_key, with_rank
        from planners.predicates import to_arrow

        projection, predicate, _ = self._resolve(snap, payload["columns"], payload.get("filter"))
        read, pushable = self._dedupe_columns(snap, projection, predicate)
        specs = tuple(
            ColumnSpec(f.id, f.name, f.type, f.aliases)
            for f in (snap.schema.field(n) for n in read)
        )
        order_by = snap.properties.get("dedupe.order_by")
        parts = []
        for name in payload["sources"]:
            s = snap.source(name)
            request = self._scan_request(snap, name, specs, pushable, None)
            tier = int(request.source.config.get("tier", DEFAULT_TIERS.get(s.kind, 0)))
            # Tasks come in source order (file list, offsets): rank the source as one stream.
            pieces = [
                execute(request, task, read).read_all()
                for task in get_planner(s.kind).plan(request)
            ]
            if pieces:
                parts.append(with_rank(pa.concat_tables(pieces), tier, 0, order_by))
        if not parts:
            return pa.RecordBatchReader.from_batches(
                arrow_schema(snap.schema, projection), iter(())
            )
        data = latest_per_key(parts, snap.primary_key)
        if predicate is not None:
            data = data.filter(to_arrow(predicate, data.schema))
        data = data.select(projection)
        if payload.get("limit") is not None:
            data = data.slice(0, int(payload["limit"]))
        return pa.RecordBatchReader.from_batches(
            data.schema, data.to_batches(max_chunksize=64 * 1024)
        )

    # ------------------------------------------------------------------ streaming deltas

    def _plan_delta(self, end: TableSnapshot, req: ReadRequest) -> PlannedRead:
        """Rows added in versions (since, end]: new Kafka offsets, new files, appended Iceberg
        snapshots. Moves and compaction relocate rows and add none, so their commits add nothing
        (Kafka offsets count once, when they first enter ``high``, wherever they live later)."""
        since = int(req.since or 0)
        projection, predicate, specs = self._resolve(end, req.columns, req.filter)
        out: list[tuple[TableSnapshot, str, dict[str, Any] | None, ScanTask]] = []
        if since < end.version:
            start = self.snapshot(end.table, since)
            summaries = {
                c.version: c.summary
                for c in self.catalog.history(end.table, limit=end.version - since)
            }
            for s in end.sources:
                if req.sources is not None and s.name not in req.sources:
                    continue
                if s.kind == "kafka":
                    before = next((x for x in start.sources if x.name == s.name), None)
                    lo = (
                        int(before.state.get("high", 0))
                        if before
                        else int(
                            self.snapshot(end.table, s.added_version)
                            .source(s.name)
                            .state.get("low", 0)
                        )
                    )
                    hi = int(s.state.get("high", 0))
                    if hi > lo:
                        state = {"low": lo, "high": hi}
                        request = self._scan_request(end, s.name, specs, predicate, None, state)
                        out += [(end, s.name, state, t) for t in get_planner(s.kind).plan(request)]
                    continue
                for v in range(since + 1, end.version + 1):
                    info = summaries.get(v, {})
                    if (
                        s.name not in (*info.get("updated", ()), *info.get("added", ()))
                        or info.get("operation") in RELOCATIONS
                    ):
                        continue
                    cur, prev = self.snapshot(end.table, v), self.snapshot(end.table, v - 1)
                    old = next((x for x in prev.sources if x.name == s.name), None)
                    out += self._added(cur, old, s.name, specs, predicate)
        endpoints = []
        for snap, name, override, task in out:
            payload: dict[str, Any] = {
                "v": TICKET_VERSION,
                "table": snap.table,
                "version": snap.version,
                "source": name,
                "kind": task.kind,
                "task": dict(task.payload),
                "exact": task.exact_filter,
                "columns": projection,
                "filter": req.filter,
                "limit": None,
            }
            if override is not None:
                payload["state"] = override
            ticket, expires = self.signer.sign(payload)
            endpoints.append(Endpoint(task, ticket, expires))
        sources = [
            {
                "name": s.name,
                "kind": s.kind,
                "pruned": False,
                "tasks": sum(1 for _, n, _, _ in out if n == s.name),
            }
            for s in end.sources
        ]
        return PlannedRead(end, arrow_schema(end.schema, projection), endpoints, sources)

    def _added(
        self,
        cur: TableSnapshot,
        old: Any,
        name: str,
        specs: tuple[ColumnSpec, ...],
        predicate: Expr | None,
    ) -> list[tuple[TableSnapshot, str, dict[str, Any] | None, ScanTask]]:
        s = cur.source(name)
        if s.kind == "files":
            before = set(old.state.get("files", [])) if old else set()
            new = [f for f in s.state.get("files", []) if f not in before]
            if not new:
                return []
            state = {**s.state, "files": new}
            request = self._scan_request(cur, name, specs, predicate, None, state)
            return [(cur, name, state, t) for t in get_planner(s.kind).plan(request)]
        if s.kind == "iceberg":
            from planners.iceberg import appended_files

            files = appended_files(
                resolve_config(s.config),
                old.state.get("snapshot_id") if old else None,
                s.state.get("snapshot_id"),
            )
            return (
                [(cur, name, None, ScanTask(name, s.kind, {"files": files}, exact_filter=False))]
                if files
                else []
            )
        raise InvalidArgument(
            f"streaming reads support kafka, files and iceberg sources; {name!r} is {s.kind} and changed"
        )

    def open(self, payload: dict[str, Any]) -> pa.RecordBatchReader:
        """The stream of one verified ticket payload."""
        if payload.get("v") != TICKET_VERSION:
            raise InvalidArgument(f"unsupported ticket version {payload.get('v')!r}")
        snap = self.snapshot(payload["table"], int(payload["version"]))
        if payload.get("dedupe"):
            return self._open_dedupe(snap, payload)
        projection, predicate, specs = self._resolve(
            snap, payload["columns"], payload.get("filter")
        )
        request = self._scan_request(
            snap, payload["source"], specs, predicate, payload.get("limit"), payload.get("state")
        )
        task = ScanTask(payload["source"], payload["kind"], payload["task"], bool(payload["exact"]))
        return execute(request, task, projection)
