"""``delta`` sources: one Delta Lake table (delta-rs, ``deltalake``) read at the pinned version.

Config: ``uri`` (a path or ``s3://``/``gs://``/``az://`` URI of the table) and optional
``storage_options`` (delta-rs object-store options). State: ``{"version": int | null}`` (null:
no version published yet, so no rows).

Planning opens the table at the pinned version as a pyarrow dataset: every data file is a
fragment carrying its partition values and column statistics from the Delta log, so the
pushed-down filter prunes whole files before any is opened. Files are grouped into tasks by
size; reading scans the task's files with the filter and projection (applied exactly).
Tables whose protocol needs reader features delta-rs cannot hand to pyarrow (deletion vectors,
column mapping) are refused with a clear error rather than read wrongly.

Writes: DoPut appends with ``write_deltalake`` and tags the Delta commit with the harness
commit id, so a retry finds it instead of writing twice. Schema changes: additive columns
through a schema-merging empty append; type widening is not supported by delta-rs here.
Streaming: the files added by the append versions between two states (relocations excluded).
Direct tasks: the Parquet files themselves, for tables without partition columns (partition
values live in the log, not in the files, so those tasks are read through the gateway).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from flight_gateway.protocol import operations as ops
from flight_gateway.protocol.errors import InvalidArgument, NotFound, Unavailable
from planners import locations
from planners.common import (
    apply_residual,
    conform,
    empty_reader,
    fit_to_schema,
    floating_columns,
    group_by_size,
    physical_names,
    pushdown,
    scanner_reader,
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
from planners.layout import FileLayout, LaidFile, as_uri
from planners.predicates import columns, nan_safe, to_arrow

DEFAULT_BATCH_ROWS = 64 * 1024
_opened: OrderedDict[str, tuple[Any, ds.FileSystemDataset]] = OrderedDict()
_lock = threading.Lock()


@dataclass(frozen=True, kw_only=True)
class DeltaConfig(SourceConfig):
    #: Path or URI of the Delta table.
    uri: str
    #: delta-rs object store options (credentials, endpoints); may use ``${NAME}`` references.
    storage_options: dict[str, str] = field(default_factory=dict)


def _version(source: str, state: Mapping[str, Any]) -> int | None:
    v = state.get("version")
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise InvalidArgument(f"source {source!r}: version must be an integer >= 0, got {v!r}")
    return v


#: delta-rs object-store options naming a network endpoint; other network-like keys are refused.
STORAGE_NETWORK = locations.OBJECT_STORE_ENDPOINTS


def file_locations(table: Any, paths: Sequence[str]) -> list[str]:
    """Where the files of ``paths`` (as the log lists them: relative to the table, or absolute)
    are, for checking them against the gateway's allow-lists before they are read or signed."""
    root = str(table.table_uri).rstrip("/")
    return [p if locations.is_uri(p) or p.startswith("/") else f"{root}/{p}" for p in paths]


def _table(config: DeltaConfig, version: int | None = None) -> Any:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(config.uri, version=version, storage_options=config.storage_options)
    except TableNotFoundError as e:
        raise NotFound(f"no Delta table at the source's uri (version {version})") from e
    except Exception as e:  # delta-rs raises plain exceptions for a missing version
        if "version" in str(e).lower() or "not found" in str(e).lower():
            raise NotFound(f"Delta table version {version} cannot be loaded: {e}") from e
        raise Unavailable(f"cannot open the Delta table: {e}") from e


def _open(source: SourceRef, config: DeltaConfig, version: int) -> tuple[Any, ds.FileSystemDataset]:
    """(DeltaTable, pyarrow dataset) at ``version``; a version never changes, so both are
    cached and DoGet calls reuse the log replay of the planning call."""
    key = json.dumps([config.uri, config.storage_options, version], sort_keys=True)
    with _lock:
        hit = _opened.get(key)
        if hit is not None:
            _opened.move_to_end(key)
            return hit
    table = _table(config, version)
    try:
        dataset = table.to_pyarrow_dataset()
    except Exception as e:  # DeltaProtocolError: reader features pyarrow cannot apply
        raise InvalidArgument(
            f"source {source.name!r}: this Delta table cannot be read here ({e}); "
            "tables with deletion vectors or column mapping are not supported"
        ) from e
    with _lock:
        _opened[key] = (table, dataset)
        while len(_opened) > 64:
            _opened.popitem(last=False)
    return table, dataset


def _history_after(table: Any, version: int | None) -> list[dict[str, Any]]:
    """Commit infos of the versions after ``version``, oldest first."""
    start = -1 if version is None else version
    return sorted(
        (h for h in table.history() if int(h.get("version", -1)) > start),
        key=lambda h: int(h["version"]),
    )


def _is_relocation(info: Mapping[str, Any]) -> bool:
    return ops.snapshot_is_relocation({k: str(v) for k, v in info.items() if isinstance(v, str)})


class DeltaKind(SourceKind):
    config_model = DeltaConfig
    cumulative = False
    warm_imports = ("deltalake",)

    def validate_state(self, name: str, state: Mapping[str, Any]) -> None:
        _version(name, state)

    def reaches(self, source: SourceRef) -> list[Reach]:
        config: DeltaConfig = self.parse_config(source)
        return locations.storage("uri", config.uri) + locations.network_options(
            "storage_options", config.storage_options, STORAGE_NETWORK
        )

    # ------------------------------------------------------------------ reading

    def _plan_files(self, request: ScanRequest, only: set[str] | None = None) -> list[ScanTask]:
        src = request.source
        version = _version(src.name, src.state)
        if version is None:
            return []
        config: DeltaConfig = self.parse_config(src)
        table, dataset = _open(src, config, version)
        mapping = physical_names(request.columns, dataset.schema.names)
        pred = pushdown(request, mapping)
        if pred is not None:  # file statistics leave NaN out (see nan_safe)
            pred, _ = nan_safe(pred, floating_columns(dataset.schema))
        expr = to_arrow(pred, dataset.schema) if pred is not None else None
        sizes = {
            r["path"]: int(r["size_bytes"])
            for r in pa.table(table.get_add_actions(flatten=True))
            .select(["path", "size_bytes"])
            .to_pylist()
        }
        files = [
            (f.path, sizes.get(f.path, 0))
            for f in dataset.get_fragments(filter=expr)
            if only is None or f.path in only
        ]
        request.check_task_count(len(files))
        request.check_files("data file", file_locations(table, [f for f, _ in files]))
        groups = group_by_size(files, config.target_task_bytes)
        return [ScanTask(src.name, {"files": g}, exact_filter=True) for g in groups]

    def plan(self, request: ScanRequest) -> list[ScanTask]:
        return self._plan_files(request)

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        src = request.source
        cols = request.columns
        version = _version(src.name, src.state)
        if version is None:
            return empty_reader(cols)
        table, dataset = _open(src, self.parse_config(src), version)
        request.check_files("data file", file_locations(table, list(task.payload["files"])))
        wanted = set(task.payload["files"])
        frags = [f for f in dataset.get_fragments() if f.path in wanted]
        if len(frags) != len(wanted):
            raise NotFound(f"source {src.name!r}: ticket names files not in Delta version")
        part = ds.FileSystemDataset(frags, dataset.schema, dataset.format, dataset.filesystem)
        mapping = physical_names(cols, dataset.schema.names)
        pred = pushdown(request, mapping)
        exact = pred is not None
        if pred is not None:  # row-group statistics leave NaN out (see nan_safe)
            floats = floating_columns(dataset.schema)
            pred, exact = nan_safe(pred, floats)
            # deltalake's fragments carry min/max guarantees that leave NaN out too, so pyarrow
            # may pass NaN rows through a filter it takes for always true: check the rows.
            exact = exact and not (columns(pred) & floats)
        scanner = part.scanner(
            columns=sorted(set(mapping.values())) or dataset.schema.names[:1],
            filter=to_arrow(pred, dataset.schema) if pred is not None else None,
            batch_size=DEFAULT_BATCH_ROWS,
            use_threads=True,
        )
        out = conform(scanner_reader(scanner), cols, mapping)
        if request.predicate is not None and not exact:
            out = apply_residual(out, request.predicate)
        return out

    def engine_scan(self, request: ScanRequest, tasks: Sequence[ScanTask]) -> EngineScan | None:
        return parquet_engine_scan(self, request, tasks)

    def direct_files(self, request: ScanRequest, task: ScanTask) -> DirectFiles | None:
        src = request.source
        version = _version(src.name, src.state)
        if version is None:
            return None
        table, _ = _open(src, self.parse_config(src), version)
        if table.metadata().partition_columns:
            return None  # partition values are in the log, not in the files
        paths = file_locations(table, list(task.payload["files"]))
        return DirectFiles("parquet", tuple(p.removeprefix("file://") for p in paths))

    def layout(self, request: ScanRequest) -> FileLayout | None:
        """The version's data files in place, columns by name; None for partitioned tables
        (partition values live in the log, not in the files)."""
        src = request.source
        version = _version(src.name, src.state)
        if version is None:
            return FileLayout((), {})
        table, dataset = _open(src, self.parse_config(src), version)
        if table.metadata().partition_columns:
            return None
        adds = pa.table(table.get_add_actions(flatten=True)).select(
            ["path", "size_bytes", "num_records"]
        )
        paths = file_locations(table, adds.column("path").to_pylist())
        request.check_files("data file", paths)
        sizes, counts = (
            adds.column("size_bytes").to_pylist(),
            adds.column("num_records").to_pylist(),
        )
        if any(n is None for n in counts):
            return None  # a log without row counts: made a slice of instead
        mapping = physical_names(request.columns, dataset.schema.names)
        physical = {c: (p, dataset.schema.field(p).type) for c, p in mapping.items()}
        files = tuple(
            LaidFile(as_uri(p), int(size), int(n))
            for p, size, n in zip(paths, sizes, counts, strict=True)
        )
        others = frozenset(set(dataset.schema.names) - set(mapping.values()))
        return FileLayout(files, physical, other_names=others)

    def plan_added(self, request: ScanRequest, before: Mapping[str, Any] | None) -> list[ScanTask]:
        """Files added by the append versions between the two states that the pinned version
        still holds; versions that relocate rows (movers, compaction) add none."""
        src = request.source
        until = _version(src.name, src.state)
        since = _version(src.name, before) if before else None
        if until is None or until == since:
            return []
        config: DeltaConfig = self.parse_config(src)
        table = _table(config, until)
        added: set[str] = set()
        previous = _paths(config, since)
        for info in _history_after(table, since):
            v = int(info["version"])
            if v > until:
                break
            current = _paths(config, v)
            if not _is_relocation(info):
                added |= current - previous
            previous = current
        return self._plan_files(request, added) if added else []

    # ------------------------------------------------------------------ writing

    def append(self, ctx: AppendContext, rows: pa.Table) -> dict[str, Any]:
        from deltalake import CommitProperties, write_deltalake

        src = ctx.source
        config: DeltaConfig = self.parse_config(src)
        pinned = _version(src.name, src.state)
        found = _committed(_table(config), pinned, ctx.commit_id)
        if found is not None:  # an earlier try of this commit appended already
            return {**src.state, "version": found}
        schema = pa.schema(_table(config).schema().to_arrow())
        data = fit_to_schema(rows, schema, ctx.aliases)
        write_deltalake(
            config.uri,
            data,
            mode="append",
            storage_options=config.storage_options or None,
            commit_properties=CommitProperties(
                custom_metadata=ops.write_properties(ctx.commit_id, ctx.relocation)
            ),
        )
        version = _committed(_table(config), pinned, ctx.commit_id)
        if version is None:
            raise Unavailable(f"source {src.name!r}: the Delta append is not in the table's log")
        return {**src.state, "version": version}

    def apply_additive(self, source: SourceRef, changes: Sequence[Additive]) -> None:
        from deltalake import write_deltalake

        config: DeltaConfig = self.parse_config(source)
        current = pa.schema(_table(config).schema().to_arrow())
        added = []
        for c in changes:
            phys = next((n for n in c.names if n in current.names), None)
            if c.op == "add" and phys is None:
                added.append(pa.field(c.names[0], c.type, nullable=True))
            elif c.op == "widen" and phys is not None:
                raise NotImplementedError(
                    f"source {source.name!r}: widening Delta column {phys!r} is not supported "
                    "(delta-rs has no type widening); add a new column instead"
                )
        if added:
            # An empty append that merges the schema: one Delta commit adding the columns.
            empty = pa.schema([*current, *added]).empty_table()
            write_deltalake(
                config.uri,
                empty,
                mode="append",
                schema_mode="merge",
                storage_options=config.storage_options or None,
            )


def _paths(config: DeltaConfig, version: int | None) -> set[str]:
    if version is None:
        return set()
    actions = pa.table(_table(config, version).get_add_actions(flatten=True))
    return set(actions.column("path").to_pylist())


def _committed(table: Any, after: int | None, commit_id: str) -> int | None:
    """The version after ``after`` that a Delta commit tagged ``commit_id`` made, if any."""
    for info in _history_after(table, after):
        if info.get(ops.SNAP_COMMIT_ID) == commit_id:
            return int(info["version"])
    return None
