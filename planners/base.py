"""What every planner shares: requests, tasks, and conforming batches to the harness schema.

``plan(request) -> list[ScanTask]`` decides the work; ``read(request, task)`` turns one task into
a RecordBatchReader whose batches already have the harness schema of the pinned version
(columns matched by current name, then by former names; missing columns are nulls; types cast
to the harness type).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from flight_gateway.arrow_types import parse_type
from flight_gateway.errors import InvalidArgument
from planners.predicates import Expr, columns, rename

DEFAULT_BATCH_ROWS = 64 * 1024
MIN_TASK_BYTES = 8 * 1024 * 1024
MAX_TASK_BYTES = 128 * 1024 * 1024
TARGET_TASKS = 8


def group_by_size(
    items: Sequence[tuple[Any, int]], target_bytes: int | None = None
) -> list[list[Any]]:
    """Consecutive groups of (item, size): about TARGET_TASKS groups of 8-128 MB each, so
    clients and Spark can read a source in parallel without a task per tiny file."""
    if target_bytes is None:
        total = sum(size for _, size in items)
        target_bytes = max(MIN_TASK_BYTES, min(MAX_TASK_BYTES, total // TARGET_TASKS + 1))
    groups: list[list[Any]] = []
    size = 0
    for item, n in items:
        if not groups or size + n > target_bytes:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += n
    return groups


@dataclass(frozen=True)
class ColumnSpec:
    """A harness column to produce: its stable id, current name, type and former names."""

    field_id: int
    name: str
    type: str
    aliases: tuple[str, ...] = ()

    @property
    def arrow_type(self) -> pa.DataType:
        return parse_type(self.type)


@dataclass(frozen=True)
class SourceRef:
    """The source as pinned: config with ${ENV} already resolved (never put in tickets)."""

    name: str
    kind: str
    config: Mapping[str, Any]
    partition: Mapping[str, Any]
    state: Mapping[str, Any]


@dataclass(frozen=True)
class ScanRequest:
    source: SourceRef
    columns: tuple[ColumnSpec, ...]  # columns to produce: projection plus filter columns
    predicate: Expr | None = None  # over harness column names
    limit: int | None = None


@dataclass(frozen=True)
class ScanTask:
    """One unit of reading: one Flight endpoint, one Spark partition. JSON payload, no secrets."""

    source: str
    kind: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    #: True when ``read`` applies the request's whole predicate exactly (no residual needed).
    exact_filter: bool = False


class Planner(Protocol):
    def plan(self, request: ScanRequest) -> list[ScanTask]: ...

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader: ...


def target_schema(cols: Sequence[ColumnSpec]) -> pa.Schema:
    # Every output field is nullable: a source may lack a column (nulls), and Spark requires it.
    return pa.schema([pa.field(c.name, c.arrow_type, nullable=True) for c in cols])


def physical_names(cols: Sequence[ColumnSpec], available: Iterable[str]) -> dict[str, str]:
    """Harness name -> physical column name, for the columns this source has."""
    avail = set(available)
    out: dict[str, str] = {}
    for c in cols:
        for candidate in (c.name, *c.aliases):
            if candidate in avail:
                out[c.name] = candidate
                break
    return out


def pushdown(request: ScanRequest, mapping: Mapping[str, str]) -> Expr | None:
    """The predicate over physical names, or None when it references a column the source lacks."""
    pred = request.predicate
    if pred is None or not columns(pred) <= set(mapping):
        return None
    return rename(pred, lambda c: mapping[c])


def conform_batch(
    batch: pa.RecordBatch, cols: Sequence[ColumnSpec], mapping: Mapping[str, str], schema: pa.Schema
) -> pa.RecordBatch:
    arrays = []
    for c, f in zip(cols, schema, strict=True):
        phys = mapping.get(c.name)
        if phys is None or batch.schema.get_field_index(phys) < 0:
            arrays.append(pa.nulls(batch.num_rows, f.type))
            continue
        arr = batch.column(phys)
        if isinstance(arr.type, pa.ExtensionType):  # e.g. ADBC's opaque Postgres NUMERIC
            arr = arr.storage
        if arr.type != f.type:
            try:
                arr = arr.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise InvalidArgument(
                    f"column {c.name!r}: cannot read {arr.type} as {f.type}: {e}"
                ) from e
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def conform(
    reader: pa.RecordBatchReader | Iterable[pa.RecordBatch],
    cols: Sequence[ColumnSpec],
    mapping: Mapping[str, str],
    physical_schema: pa.Schema | None = None,
) -> pa.RecordBatchReader:
    """Conform a physical stream to the harness columns; pass C++ readers through untouched
    when they already match, so Flight streams them without Python in the loop."""
    schema = target_schema(cols)
    if isinstance(reader, pa.RecordBatchReader):
        physical_schema = reader.schema
        if physical_schema.equals(schema) and all(mapping.get(c.name) == c.name for c in cols):
            return reader

    def gen() -> Iterator[pa.RecordBatch]:
        for batch in reader:
            yield conform_batch(batch, cols, mapping, schema)

    return pa.RecordBatchReader.from_batches(schema, gen())


def closing(reader: pa.RecordBatchReader, *resources: Any) -> pa.RecordBatchReader:
    """Keep ``resources`` (connections, cursors, clients that own the stream) alive until the
    stream ends, then close them in order."""

    def gen() -> Iterator[pa.RecordBatch]:
        try:
            yield from reader
        finally:
            for r in resources:
                r.close()

    return pa.RecordBatchReader.from_batches(reader.schema, gen())


def chain_readers(
    schema: pa.Schema, readers: Iterable[pa.RecordBatchReader]
) -> pa.RecordBatchReader:
    def gen() -> Iterator[pa.RecordBatch]:
        for r in readers:
            yield from r

    return pa.RecordBatchReader.from_batches(schema, gen())
