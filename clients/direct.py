"""Running direct tasks where the client is: files read with Arrow's C++ dataset readers.

For each file, every harness column is found by Parquet field id, else by its current or former
names; the file is then scanned with an explicit schema in the task's column order and the
harness types, so Arrow casts narrower types, fills missing columns with nulls and applies the
task's Substrait filter (the exact residual the gateway would apply).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from flight_gateway.protocol.arrow_types import parse_type
from flight_gateway.protocol.direct import DirectColumn, DirectTask

_FIELD_ID = b"PARQUET:field_id"


def _filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    if "://" in location:
        fs, path = pafs.FileSystem.from_uri(location)
        return fs, path
    return pafs.LocalFileSystem(), location


def _physical(columns: tuple[DirectColumn, ...], schema: pa.Schema) -> list[str | None]:
    """The file's column for each harness column (None: the file lacks it)."""
    by_id: dict[int, str] = {}
    for f in schema:
        raw = (f.metadata or {}).get(_FIELD_ID)
        if raw is not None:
            by_id[int(raw)] = f.name
    names = set(schema.names)
    out: list[str | None] = []
    for c in columns:
        if c.field_id is not None and c.field_id in by_id:
            out.append(by_id[c.field_id])
        else:
            out.append(next((n for n in c.names if n in names), None))
    return out


def _filter(task: DirectTask) -> pc.Expression | None:
    if task.filter_substrait is None:
        return None
    return pc.Expression.from_substrait(base64.b64decode(task.filter_substrait))


def _read_file(task: DirectTask, location: str, flt: pc.Expression | None) -> pa.Table:
    fs, path = _filesystem(location)
    physical = _physical(task.columns, ds.dataset(path, format=task.format, filesystem=fs).schema)
    # Columns the file lacks get their harness name (the scan fills them with nulls); the
    # explicit schema's order is the task's, which the Substrait filter's field indices expect.
    names = [p or c.name for p, c in zip(physical, task.columns, strict=True)]
    schema = pa.schema(
        [pa.field(n, parse_type(c.type)) for n, c in zip(names, task.columns, strict=True)]
    )
    dataset = ds.dataset(path, format=task.format, filesystem=fs, schema=schema)
    table = dataset.to_table(columns=names, use_threads=True)
    # The Substrait filter's field references are positions in the task's column order. The
    # Parquet reader would resolve them against each file's own column order when pruning row
    # groups, so the filter is applied to the typed table instead (exact, no pruning).
    if flt is not None:
        table = table.filter(flt)
    return table.rename_columns([c.name for c in task.columns])


def run(task: DirectTask) -> pa.Table:
    """The rows of a verified direct task: exactly its ``output`` columns, filtered."""
    flt = _filter(task)
    parts = [_read_file(task, f, flt) for f in task.files]
    schema = pa.schema([pa.field(c.name, parse_type(c.type)) for c in task.columns])
    table = pa.concat_tables(parts) if parts else schema.empty_table()
    table = _with_constants(table, task.constants)
    return table.select(list(task.output))


def _with_constants(table: pa.Table, constants: Mapping[str, object]) -> pa.Table:
    for name, value in constants.items():
        table = table.append_column(name, pa.array([value] * table.num_rows, pa.string()))
    return table
