"""Run one task end to end: the kind's read, ``_source``, residual filter, projection, limit."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from planners.common import apply_residual
from planners.kind import ScanRequest, ScanTask, SourceKind


def _fill_source(reader: pa.RecordBatchReader, name: str) -> pa.RecordBatchReader:
    """The ``_source`` metadata column: the source's name on every row."""
    idx = reader.schema.get_field_index("_source")
    field = reader.schema.field(idx)

    def gen() -> Iterator[pa.RecordBatch]:
        for batch in reader:
            if batch.column(idx).null_count == batch.num_rows:
                value = pa.array([name] * batch.num_rows, pa.string()).cast(field.type)
                batch = batch.set_column(idx, field, value)
            yield batch

    return pa.RecordBatchReader.from_batches(reader.schema, gen())


def _project_and_limit(
    reader: pa.RecordBatchReader, names: list[str], limit: int | None
) -> pa.RecordBatchReader:
    needs_projection = reader.schema.names != names
    if not needs_projection and limit is None:
        return reader  # C++ reader straight to Flight when nothing is left to do
    schema = pa.schema([reader.schema.field(n) for n in names])

    def gen() -> Iterator[pa.RecordBatch]:
        remaining = limit
        for batch in reader:
            if needs_projection:
                batch = batch.select(names)
            if remaining is not None:
                if remaining <= 0:
                    break
                if batch.num_rows > remaining:
                    batch = batch.slice(0, remaining)
                remaining -= batch.num_rows
            yield batch

    return pa.RecordBatchReader.from_batches(schema, gen())


def execute(
    kind: SourceKind, request: ScanRequest, task: ScanTask, output: Sequence[str]
) -> pa.RecordBatchReader:
    """Batches of ``task`` with exactly the ``output`` columns, filtered exactly, limited."""
    reader = kind.read(request, task)
    if "_source" in reader.schema.names:
        reader = _fill_source(reader, request.source.name)
    if request.predicate is not None and not task.exact_filter:
        reader = apply_residual(reader, request.predicate)
    return _project_and_limit(reader, list(output), request.limit)
