"""Iceberg data files without deletes read as plain Parquet datasets, columns by field id.

pyiceberg's ``ArrowScan`` sets up each data file in Python (its schema projected by field id,
its filter bound, its batches cast): ~1 ms a file, 116-205 ms for 150 files of 700 rows against
36-54 ms for one ``pyarrow.dataset`` over them. A table streamed into holds hundreds of such
files between compactions, and under ``bench_chaos`` its readers spent a quarter of the read
processes' time there. Where nothing needs pyiceberg (no delete file applies, Parquet files on
the local filesystem, primitive columns, every file naming each selected field id under the
name the pinned schema gives it, or lacking both the id and the name; a file without field ids,
as ``add_files`` adds them, by the table's name mapping), runs of files with one
physical schema are scanned as one dataset each, the filter pushed in for pruning (the gateway
applies the exact predicate after: ``ScanTask.exact_filter`` is false for Iceberg). Anything
else (deletes, a column renamed since a file was written, other formats or filesystems) goes
through pyiceberg as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from planners.common import (
    DEFAULT_BATCH_ROWS,
    conform,
    floating_columns,
    pushdown,
    scanner_reader,
)
from planners.file_scan import SameSchema, chained, listed, run_dataset, runs
from planners.iceberg_mor import Planned
from planners.kind import ScanRequest
from planners.predicates import columns as referenced
from planners.predicates import nan_safe, to_arrow

FIELD_ID = b"PARQUET:field_id"
_LOCAL = pafs.LocalFileSystem()
_PLAIN_TYPES = frozenset({
    "BooleanType", "IntegerType", "LongType", "FloatType", "DoubleType", "DecimalType",
    "DateType", "TimeType", "TimestampType", "TimestamptzType", "StringType", "BinaryType",
    "FixedType",
})  # fmt: skip


def plain_read(
    request: ScanRequest, scan: Any, schema: Any, mapping: Mapping[str, str], planned: Planned,
    tasks: Sequence[Any],
) -> pa.RecordBatchReader | None:  # fmt: skip
    """The rows of ``tasks`` (pyiceberg ``FileScanTask``s of ``scan``, whose pinned schema is
    ``schema``) conformed to the harness columns, or None when pyiceberg must read them."""
    fields = {c: schema.find_field(mapping[c.name]) for c in request.columns if c.name in mapping}
    if not fields or any(type(f.field_type).__name__ not in _PLAIN_TYPES for f in fields.values()):
        return None
    paths = []
    for t in tasks:
        f = t.file
        if t.delete_files or planned.deletes_for(f.file_path):
            return None
        if "PARQUET" not in str(f.file_format).upper():
            return None
        path = _local(f.file_path)
        if path is None:
            return None
        paths.append(path)
    files = listed(request, _LOCAL, paths, "parquet")
    by_path = {f.path: f for f in files}
    wanted = {int(f.field_id): f.name for f in fields.values()}
    by_name = _name_mapping(scan)
    keys = [_names(f.schema, wanted, by_name) for f in files]
    if any(k is None for k in keys):
        return None
    schemas = [f.schema for f in files]
    same = [(k, SameSchema(f.schema), f.small) for k, f in zip(keys, files, strict=True)]
    groups = runs(paths, same, schemas)
    pred = pushdown(request, mapping)

    def one(run_schema: pa.Schema, group: list[str]) -> pa.RecordBatchReader:
        present = [n for n in wanted.values() if n in run_schema.names]
        members = [by_path[p] for p in group]
        data = run_dataset(request, _LOCAL, members, run_schema, "parquet")
        options: dict[str, Any] = {"columns": present, "batch_size": DEFAULT_BATCH_ROWS}
        if pred is not None and referenced(pred) <= set(present):
            # Pruning only (the gateway applies the exact predicate): NaN kept where it may match.
            safe, _ = nan_safe(pred, floating_columns(run_schema))
            options["filter"] = to_arrow(safe, run_schema)
        return conform(scanner_reader(data.scanner(use_threads=True, **options)),
                       request.columns, mapping)  # fmt: skip

    return chained(request, groups, one)


def _local(location: str) -> str | None:
    """The local path of a ``file:`` location (or an absolute path); None for others, and for
    escaped characters, which pyiceberg's file IO resolves its own way."""
    if location.startswith("file://"):
        path = location[len("file://") :]
    elif location.startswith("file:/"):
        path = location[len("file:") :]
    else:
        path = location
    return path if path.startswith("/") and "%" not in path else None


def _name_mapping(scan: Any) -> dict[str, int]:
    """Top-level column name -> field id by the table's name mapping (for data files written
    without field ids and added to the table, as ``add_files`` does)."""
    mapping = scan.table_metadata.name_mapping()
    if mapping is None:
        return {}
    return {n: int(f.field_id) for f in mapping.root if f.field_id is not None for n in f.names}


def _names(
    schema: pa.Schema, wanted: Mapping[int, str], by_name: Mapping[str, int]
) -> tuple[str, ...] | None:
    """The selected fields' names in a file's ``schema`` (by field id, or by the table's name
    mapping for a file without any), None when a file differs from the pinned schema: some
    fields with ids and others without, no ids and no mapping, a field under another name, or
    a column of a selected field's name holding another field."""
    with_ids = [f for f in schema if f.metadata and FIELD_ID in f.metadata]
    if with_ids and len(with_ids) != len(schema):
        return None
    if with_ids:
        ids = {int(f.metadata[FIELD_ID]): f.name for f in with_ids}
    elif by_name:
        ids = {by_name[f.name]: f.name for f in schema if f.name in by_name}
    else:
        return None
    out = []
    for field_id, name in wanted.items():
        found = ids.get(field_id)
        if found is None and name in schema.names:
            return None
        if found is not None and found != name:
            return None
        out.append(found or "")
    return tuple(out)
