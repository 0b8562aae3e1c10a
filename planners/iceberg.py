"""``iceberg`` sources: one pyiceberg table read at the pinned ``snapshot_id``.

Config: ``catalog`` (pyiceberg catalog properties, e.g. ``{"type": "sql", "uri": ...,
"warehouse": ...}``), optional ``catalog_name``, and ``identifier`` (``"db.table"``).
State: ``{"snapshot_id": int | null}`` (null: the table had no snapshot, so no rows).
Planning runs pyiceberg's ``plan_files`` with the row filter and groups data files into tasks;
reading runs ``ArrowScan`` over the task's files (position deletes applied by pyiceberg).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from flight_gateway.errors import InvalidArgument, NotFound, Unavailable
from planners.base import (
    ScanRequest,
    ScanTask,
    conform,
    group_by_size,
    physical_names,
    pushdown,
    target_schema,
)
from planners.predicates.iceberg import to_iceberg

_catalogs: dict[str, Any] = {}
_plans: OrderedDict[str, tuple[Any, dict[str, str], list[Any]]] = OrderedDict()
_lock = threading.Lock()


def load_table(config: Mapping[str, Any]) -> Any:
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    props = config.get("catalog")
    ident = config.get("identifier")
    if not isinstance(props, Mapping) or not isinstance(ident, str):
        raise InvalidArgument("iceberg source config needs 'catalog' (properties) and 'identifier'")
    key = json.dumps([config.get("catalog_name", "default"), props], sort_keys=True)
    with _lock:
        cat = _catalogs.get(key)
        if cat is None:
            try:
                cat = load_catalog(
                    str(config.get("catalog_name", "default")),
                    **{k: str(v) for k, v in props.items()},
                )
            except Exception as e:
                raise Unavailable(f"cannot open Iceberg catalog: {e}") from e
            _catalogs[key] = cat
    try:
        return cat.load_table(ident)
    except NoSuchTableError as e:
        raise NotFound(f"Iceberg table {ident!r} does not exist") from e


class IcebergPlanner:
    def _scan(self, request: ScanRequest) -> tuple[Any, dict[str, str], list[Any]]:
        """(scan, name mapping, planned FileScanTasks), cached per pinned request: a snapshot
        never changes, so DoGet calls reuse the plan without reloading table metadata."""
        snap_id = request.source.state.get("snapshot_id")
        if not isinstance(snap_id, int):
            raise InvalidArgument(
                f"source {request.source.name!r}: snapshot_id must be an integer, got {snap_id!r}"
            )
        key = json.dumps(
            [
                request.source.config.get("catalog"),
                request.source.config.get("identifier"),
                snap_id,
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
        table = load_table(request.source.config)
        snapshot = table.snapshot_by_id(snap_id)
        if snapshot is None:
            raise NotFound(
                f"source {request.source.name!r}: Iceberg snapshot {snap_id} does not exist "
                "(expired?)"
            )
        schema = table.schemas().get(snapshot.schema_id, table.schema())
        mapping = physical_names(request.columns, [f.name for f in schema.fields])
        pred = pushdown(request, mapping)
        scan = table.scan(
            row_filter=to_iceberg(pred),
            # With no requested column in this table, still read one so row counts (and
            # deletes) are right; conform then yields nulls for every requested column.
            selected_fields=tuple(sorted(set(mapping.values()))) or (schema.fields[0].name,),
            snapshot_id=snap_id,
        )
        result = (scan, mapping, list(scan.plan_files()))
        with _lock:
            _plans[key] = result
            while len(_plans) > 256:
                _plans.popitem(last=False)
        return result

    def plan(self, request: ScanRequest) -> list[ScanTask]:
        src = request.source
        if src.state.get("snapshot_id") is None:
            return []
        _, _, tasks = self._scan(request)
        target = src.config.get("target_task_bytes")
        groups = group_by_size(
            [(t.file.file_path, int(t.file.file_size_in_bytes)) for t in tasks],
            int(target) if target else None,
        )
        # The gateway re-applies the exact predicate: Iceberg's filter only prunes.
        return [ScanTask(src.name, src.kind, {"files": g}, exact_filter=False) for g in groups]

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        from pyiceberg.io.pyarrow import ArrowScan

        cols = request.columns
        if request.source.state.get("snapshot_id") is None:
            return pa.RecordBatchReader.from_batches(target_schema(cols), iter(()))
        scan, mapping, tasks = self._scan(request)
        wanted = set(task.payload["files"])
        mine = [t for t in tasks if t.file.file_path in wanted]
        if len(mine) != len(wanted):
            raise NotFound(
                f"source {request.source.name!r}: ticket names data files not in snapshot"
            )
        batches = ArrowScan(
            scan.table_metadata,
            scan.io,
            scan.projection(),
            scan.row_filter,
            scan.case_sensitive,
            None,
        ).to_record_batches(mine)
        return conform(batches, cols, mapping)


def lineage_after(
    table: Any, since: int | None, until: int | None = None
) -> tuple[list[Any], bool]:
    """Snapshots after ``since`` on the lineage ending at ``until`` (default: the current
    snapshot), oldest first, and whether ``since`` was on that lineage (when it is not, every
    ancestor is returned)."""
    from pyiceberg.table.snapshots import ancestors_of

    end = table.current_snapshot() if until is None else table.snapshot_by_id(int(until))
    if end is None:
        if until is not None:
            raise NotFound(f"Iceberg snapshot {until} does not exist (expired?)")
        return [], since is None
    out: list[Any] = []
    for snap in ancestors_of(end, table.metadata):
        if snap.snapshot_id == since:
            return list(reversed(out)), True
        out.append(snap)
    return list(reversed(out)), since is None


def snapshot_properties(snap: Any) -> dict[str, str]:
    return dict(snap.summary.additional_properties) if snap.summary is not None else {}


def added_data_files(table: Any, snap: Any) -> list[str]:
    """Paths of the data files ``snap`` itself added."""
    return [
        e.data_file.file_path
        for m in snap.manifests(table.io)
        for e in m.fetch_manifest_entry(table.io)
        if e.snapshot_id == snap.snapshot_id
    ]


def appended_files(config: Mapping[str, Any], since: int | None, until: int | None) -> list[str]:
    """Data files added by the append snapshots after ``since`` up to ``until`` (for streaming).
    Snapshots written by movers (``harness.source``) or compaction (``harness.compaction``)
    relocate rows and add none, so their files are skipped."""
    if until is None or until == since:
        return []
    table = load_table(config)
    files: list[str] = []
    for snap in lineage_after(table, since, until)[0]:
        props = snapshot_properties(snap)
        if "harness.source" not in props and "harness.compaction" not in props:
            files += added_data_files(table, snap)
    return files
