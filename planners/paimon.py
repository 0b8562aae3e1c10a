"""``paimon`` sources: one Apache Paimon table (pypaimon, filesystem catalog) at a pinned snapshot.

Config: ``warehouse`` (path or URI of the filesystem catalog), ``identifier`` (``"db.table"``)
and optional ``catalog_options``. State: ``{"snapshot_id": int | null}`` (null: no snapshot
published yet, so no rows).

Planning opens the table with ``scan.snapshot-id`` and asks pypaimon for splits with the
projection, the partition filter and the row filter (pruning only: the gateway applies the
exact residual); splits are grouped into tasks by size and named in tickets by their files.
Primary-key tables are read merged (merge on read, by pypaimon), one split at a time. Append-only
tables whose files are plain Parquet of the pinned schema (no deletion vectors) are planned file
by file and read with pyarrow directly (faster than pypaimon's reader, and parallel), and those
tasks may be direct tasks that clients read themselves.

Writes: DoPut appends one batch commit whose snapshot carries the harness commit id, so a
retry finds it. Schema changes: added columns through ``alter_table``; widening is refused.
Streaming (append-only tables): the data files that the append snapshots between two states
added; primary-key tables have no "rows added" and refuse ``since``.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from flight_gateway.protocol import operations as ops
from flight_gateway.protocol.errors import InvalidArgument, NotFound, Unavailable
from planners import locations
from planners.common import (
    conform,
    empty_reader,
    fit_to_schema,
    group_by_size,
    physical_names,
    pushdown,
    read_files,
)
from planners.kind import (
    Additive,
    AppendContext,
    DirectFiles,
    EngineScan,
    Reach,
    ScanRequest,
    ScanTask,
    SourceConfig,
    SourceKind,
    SourceRef,
    parquet_engine_scan,
)
from planners.predicates.ast import And, Between, Cmp, Expr, In, IsNull, StartsWith

_catalogs: dict[str, Any] = {}
_plans: OrderedDict[str, _Scan] = OrderedDict()
_lock = threading.Lock()


@dataclass(frozen=True)
class _Scan:
    """A planned read of one pinned source: pypaimon's read builder and splits, and, when every
    split is plain Parquet files (append-only table, one schema, no deletion vectors), those
    files by name, which are then read with pyarrow directly and may be direct tasks."""

    builder: Any
    mapping: dict[str, str]
    splits: list[Any]
    raw: dict[str, tuple[str, int]] | None  # file name -> (path, size)


@dataclass(frozen=True, kw_only=True)
class PaimonConfig(SourceConfig):
    #: Warehouse of the filesystem catalog (path or URI).
    warehouse: str
    #: ``"database.table"``.
    identifier: str
    #: Further catalog options (e.g. object-store credentials; may use ``${NAME}``).
    catalog_options: dict[str, str] = field(default_factory=dict)
    #: Only this Paimon partition (``{"column": value}``): one harness source per partition of
    #: one table, each pinned at its own snapshot and written by its own mover.
    partition: dict[str, Any] = field(default_factory=dict)


def _snapshot_id(source: str, state: Mapping[str, Any]) -> int | None:
    snap = state.get("snapshot_id")
    if snap is not None and (isinstance(snap, bool) or not isinstance(snap, int)):
        raise InvalidArgument(f"source {source!r}: snapshot_id must be an integer, got {snap!r}")
    return snap


def load_table(config: PaimonConfig) -> Any:
    from pypaimon import CatalogFactory

    key = json.dumps([config.warehouse, config.catalog_options], sort_keys=True)
    with _lock:
        cat = _catalogs.get(key)
        if cat is None:
            try:
                cat = CatalogFactory.create(
                    {**config.catalog_options, "warehouse": config.warehouse}
                )
            except Exception as e:
                raise Unavailable(f"cannot open the Paimon catalog: {e}") from e
            _catalogs[key] = cat
    try:
        return cat.get_table(config.identifier)
    except Exception as e:  # TableNotExistException, DatabaseNotExistException
        raise NotFound(f"Paimon table {config.identifier!r} does not exist ({e})") from e


def to_paimon(expr: Expr | None, builder: Any) -> Any:
    """The top-level conjuncts pypaimon can prune with; anything else prunes nothing."""
    if expr is None:
        return None
    items = expr.items if isinstance(expr, And) else (expr,)
    parts = [p for p in (_conjunct(e, builder) for e in items) if p is not None]
    return builder.and_predicates(parts) if parts else None


def _conjunct(e: Expr, b: Any) -> Any:
    if isinstance(e, Cmp) and e.value is not None:
        method = {
            "=": b.equal,
            "!=": b.not_equal,
            "<": b.less_than,
            "<=": b.less_or_equal,
            ">": b.greater_than,
            ">=": b.greater_or_equal,
        }[e.op]
        return method(e.column, e.value)
    if isinstance(e, In) and e.values and None not in e.values:
        if any(isinstance(v, float) and v == 0 for v in e.values):
            return None  # a lookup by hash misses 0.0 for -0.0: the residual filter decides
        return b.is_in(e.column, list(e.values))
    if isinstance(e, IsNull):
        return b.is_null(e.column)
    if isinstance(e, Between) and e.low is not None and e.high is not None:
        return b.between(e.column, e.low, e.high)
    if isinstance(e, StartsWith):
        return b.startswith(e.column, e.prefix)
    return None


#: pypaimon catalog options naming a network endpoint; other network-like keys are refused.
CATALOG_NETWORK = {"fs.s3.endpoint": "uri", "fs.oss.endpoint": "uri", "s3.endpoint": "uri"}


def split_files(splits: Sequence[Any]) -> list[str]:
    """Every file the splits make pypaimon open: data files (external paths included) and
    deletion vectors."""
    out = [f.external_path or f.file_path for s in splits for f in s.files]
    for s in splits:
        out += [d.dv_index_path for d in s.data_deletion_files or [] if d is not None]
    return [p for p in out if p]


def _names(split: Any) -> list[str]:
    return [f.file_name for f in split.files]


def _size(split: Any) -> int:
    return int(sum(f.file_size for f in split.files))


class PaimonKind(SourceKind):
    config_model = PaimonConfig
    cumulative = False
    warm_imports = ("pypaimon.catalog.catalog_factory",)  # 700 modules, ~0.7 s

    def validate_state(self, name: str, state: Mapping[str, Any]) -> None:
        _snapshot_id(name, state)

    def reaches(self, source: SourceRef) -> list[Reach]:
        config: PaimonConfig = self.parse_config(source)
        return locations.storage("warehouse", config.warehouse) + locations.network_options(
            "catalog_options", config.catalog_options, CATALOG_NETWORK
        )

    # ------------------------------------------------------------------ reading

    def _scan(self, request: ScanRequest) -> _Scan:
        """The plan of a pinned request, cached: a snapshot never changes, so DoGet calls reuse
        the plan."""
        src = request.source
        snap = _snapshot_id(src.name, src.state)
        key = json.dumps(
            [
                src.config,  # all of it: sources of one table differ by partition
                snap,
                [(c.name, c.aliases) for c in request.columns],
                repr(request.predicate),
            ],
            sort_keys=True,
            default=str,
        )
        with _lock:
            hit = _plans.get(key)
            if hit is not None:
                _plans.move_to_end(key)
                return hit
        table = load_table(self.parse_config(src))
        if table.snapshot_manager().get_snapshot_by_id(snap) is None:
            raise NotFound(f"source {src.name!r}: Paimon snapshot {snap} does not exist (expired?)")
        pinned = table.copy({"scan.snapshot-id": str(snap)})
        names = [f.name for f in pinned.fields]
        mapping = physical_names(request.columns, names)
        rb = _partition_scoped(pinned.new_read_builder(), self.parse_config(src))
        rb = rb.with_projection(sorted(set(mapping.values())) or names[:1])
        predicate = to_paimon(pushdown(request, mapping), rb.new_predicate_builder())
        if predicate is not None:
            rb = rb.with_filter(predicate)
        splits = list(rb.new_scan().plan().splits())
        result = _Scan(rb, mapping, splits, _raw_files(pinned, splits))
        with _lock:
            _plans[key] = result
            while len(_plans) > 256:
                _plans.popitem(last=False)
        return result

    def _tasks(self, request: ScanRequest, scan: _Scan, splits: list[Any]) -> list[ScanTask]:
        target = self.parse_config(request.source).target_task_bytes
        name = request.source.name
        if scan.raw is not None:  # plain files: as many parallel tasks as their sizes allow
            files = [(f.file_name, int(f.file_size)) for s in splits for f in s.files]
            request.check_task_count(len(files))
            groups = group_by_size(files, target)
            return [ScanTask(name, {"files": g}, exact_filter=True) for g in groups]
        request.check_task_count(len(splits))
        groups = group_by_size([(_names(s), _size(s)) for s in splits], target)
        return [ScanTask(name, {"splits": g}) for g in groups]

    def plan(self, request: ScanRequest) -> list[ScanTask]:
        if _snapshot_id(request.source.name, request.source.state) is None:
            return []
        scan = self._scan(request)
        request.check_files("data file", split_files(scan.splits))
        return self._tasks(request, scan, scan.splits)

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        cols = request.columns
        if _snapshot_id(request.source.name, request.source.state) is None:
            return empty_reader(cols)
        scan = self._scan(request)
        if "files" in task.payload:
            paths = self._paths(request, scan, task)
            request.check_files("data file", paths)
            return read_files(request, paths)
        wanted = {n for split in task.payload["splits"] for n in split}
        chosen = [s.filter_file(lambda f: f.file_name in wanted) for s in scan.splits]
        mine = [s for s in chosen if s is not None]
        if sum(len(s.files) for s in mine) != len(wanted):
            raise NotFound(f"source {request.source.name!r}: ticket names files not in snapshot")
        request.check_files("data file", split_files(mine))
        reader = scan.builder.new_read().to_arrow_batch_reader(mine)
        return conform(reader, cols, scan.mapping)

    def _paths(self, request: ScanRequest, scan: _Scan, task: ScanTask) -> list[str]:
        raw = scan.raw or {}
        names = list(task.payload["files"])
        if any(n not in raw for n in names):
            raise NotFound(f"source {request.source.name!r}: ticket names files not in snapshot")
        return [raw[n][0] for n in names]

    def engine_scan(self, request: ScanRequest, tasks: Sequence[ScanTask]) -> EngineScan | None:
        return parquet_engine_scan(self, request, tasks)

    def direct_files(self, request: ScanRequest, task: ScanTask) -> DirectFiles | None:
        if _snapshot_id(request.source.name, request.source.state) is None:
            return None
        scan = self._scan(request)
        if scan.raw is None or "files" not in task.payload:
            return None  # merged or deletion-vector splits: pypaimon reads them here
        return DirectFiles("parquet", tuple(self._paths(request, scan, task)))

    def plan_added(self, request: ScanRequest, before: Mapping[str, Any] | None) -> list[ScanTask]:
        src = request.source
        until = _snapshot_id(src.name, src.state)
        since = _snapshot_id(src.name, before) if before else None
        if until is None or until == since:
            return []
        table = load_table(self.parse_config(src))
        if table.is_primary_key_table:
            raise InvalidArgument(
                f"source {src.name!r}: a Paimon primary-key table has no 'rows added' between "
                "snapshots (updates merge); read it without 'since'"
            )
        manager = table.snapshot_manager()
        config: PaimonConfig = self.parse_config(src)
        added: set[str] = set()
        previous = _files_at(table, config, since)
        for sid in range(since + 1 if since is not None else 1, until + 1):
            snap = manager.get_snapshot_by_id(sid)
            if snap is None:
                continue  # expired: its files are either still in a later plan or gone
            current = _files_at(table, config, sid)
            if not ops.snapshot_is_relocation(dict(snap.properties or {})):
                added |= current - previous
            previous = current
        scan = self._scan(request)
        chosen = [s.filter_file(lambda f: f.file_name in added) for s in scan.splits]
        return self._tasks(request, scan, [s for s in chosen if s is not None])

    # ------------------------------------------------------------------ writing

    def append(self, ctx: AppendContext, rows: pa.Table) -> dict[str, Any]:
        from pypaimon.schema.data_types import PyarrowFieldParser

        src = ctx.source
        table = load_table(self.parse_config(src))
        found = _committed(table, _snapshot_id(src.name, src.state), ctx.commit_id)
        if found is not None:  # an earlier try of this commit appended already
            return {**src.state, "snapshot_id": found}
        schema = pa.schema(PyarrowFieldParser.from_paimon_schema(table.fields))
        data = fit_to_schema(rows, schema, ctx.aliases)
        builder = table.new_batch_write_builder()
        write, commit = builder.new_write(), builder.new_commit()
        try:
            write.write_arrow(data)
            commit.commit(
                write.prepare_commit(),
                snapshot_properties=ops.write_properties(ctx.commit_id, ctx.relocation),
            )
        finally:
            write.close()
            commit.close()
        pinned = _snapshot_id(src.name, src.state)
        found = _committed(load_table(self.parse_config(src)), pinned, ctx.commit_id)
        if found is None:
            raise Unavailable(f"source {src.name!r}: the Paimon commit is not in the table")
        return {**src.state, "snapshot_id": found}

    def apply_additive(self, source: SourceRef, changes: Sequence[Additive]) -> None:
        from pypaimon.schema.data_types import PyarrowFieldParser
        from pypaimon.schema.schema_change import SchemaChange

        config: PaimonConfig = self.parse_config(source)
        table = load_table(config)
        names = {f.name for f in table.fields}
        todo = []
        for c in changes:
            phys = next((n for n in c.names if n in names), None)
            if c.op == "add" and phys is None:
                paimon_type = PyarrowFieldParser.to_paimon_type(c.type, True)
                todo.append(SchemaChange.add_column(c.names[0], paimon_type))
            elif c.op == "widen" and phys is not None:
                raise NotImplementedError(
                    f"source {source.name!r}: widening Paimon column {phys!r} is not supported "
                    "by pypaimon; add a new column instead"
                )
        if todo:
            catalog = _catalogs[
                json.dumps([config.warehouse, config.catalog_options], sort_keys=True)
            ]
            catalog.alter_table(config.identifier, todo)


def _raw_files(table: Any, splits: list[Any]) -> dict[str, tuple[str, int]] | None:
    """Name -> (path, size) of every file when all are plain Parquet of the pinned schema with
    nothing to merge or delete (append-only tables); None when pypaimon must read them."""
    if table.is_primary_key_table:
        return None
    schema_id = table.table_schema.id
    out: dict[str, tuple[str, int]] = {}
    for s in splits:
        if not s.raw_convertible or any(d is not None for d in s.data_deletion_files or []):
            return None
        for f in s.files:
            plain = f.schema_id == schema_id and not f.write_cols and not f.extra_files
            if not plain or not f.file_path or not f.file_name.endswith(".parquet"):
                return None
            out[f.file_name] = (f.file_path, int(f.file_size))
    return out


def _partition_scoped(rb: Any, config: PaimonConfig) -> Any:
    if not config.partition:
        return rb
    b = rb.new_predicate_builder()
    return rb.with_partition_filter(
        b.and_predicates([b.equal(k, v) for k, v in config.partition.items()])
    )


def _files_at(table: Any, config: PaimonConfig, snapshot_id: int | None) -> set[str]:
    if snapshot_id is None:
        return set()
    pinned = table.copy({"scan.snapshot-id": str(snapshot_id)})
    rb = _partition_scoped(pinned.new_read_builder(), config)
    splits = rb.new_scan().plan().splits()
    return {n for s in splits for n in _names(s)}


def _committed(table: Any, after: int | None, commit_id: str) -> int | None:
    """The snapshot after ``after`` whose properties carry ``commit_id``, if any."""
    manager = table.snapshot_manager()
    latest = manager.get_latest_snapshot()
    if latest is None:
        return None
    for sid in range(latest.id, (after or 0), -1):
        snap = manager.get_snapshot_by_id(sid)
        if snap is not None and (snap.properties or {}).get(ops.SNAP_COMMIT_ID) == commit_id:
            return int(snap.id)
    return None
