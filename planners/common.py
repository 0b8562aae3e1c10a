"""Helpers every source kind shares: conforming batches to the harness columns, task grouping.

A kind's ``read`` returns batches with the harness schema of the pinned version: columns matched
by current name, then by former names; missing columns are nulls; types cast to the harness
type (``conform``). Writers go the other way (``to_physical``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from flight_gateway.protocol.errors import InvalidArgument
from planners.kind import ColumnSpec, ScanRequest
from planners.predicates import Expr, columns, nan_safe, rename, to_arrow

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


#: A joined batch's bound in bytes, whatever its rows' width: gRPC takes several messages of a
#: stream whose client stops reading before it blocks the writer, and with 8 MiB batches a
#: 40 MB Kafka stream was read to its end (``test_kafka_consumers``: its consumer closed instead
#: of parked), holding all of it in buffers. At 1 MiB a batch is big enough that per-batch costs
#: are small next to its rows (the row bound decides for narrow rows).
COALESCE_BYTES = 1 << 20


def coalesced(
    reader: pa.RecordBatchReader, rows: int = DEFAULT_BATCH_ROWS, max_bytes: int = COALESCE_BYTES
) -> pa.RecordBatchReader:
    """``reader``'s batches, consecutive small ones joined up to ``rows`` rows (or
    ``max_bytes``); a batch that big already passes as it is. A version of a streamed-into
    source lists hundreds of files of ~100 rows between compactions, one batch each: every
    layer after the scan (a read process's stream, the gateway's relay, gRPC, the client)
    paid per batch, and 16 readers of a 0.9 M-row table moved ~2-3 M rows/s in all. Dictionary
    columns pass unjoined (their batches' dictionaries may differ)."""
    if any(pa.types.is_dictionary(f.type) for f in reader.schema):
        return reader
    schema = reader.schema

    def gen() -> Iterator[pa.RecordBatch]:
        pending: list[pa.RecordBatch] = []
        count = size = 0
        try:
            for batch in reader:
                if not pending and batch.num_rows >= rows:
                    yield batch
                    continue
                pending.append(batch)
                count += batch.num_rows
                size += batch.nbytes
                if count >= rows or size >= max_bytes:
                    yield _joined(pending)
                    pending, count, size = [], 0, 0
            if pending:
                yield _joined(pending)
        finally:  # a caller that stops early releases the source's stream (connections) now
            reader.close()

    return pa.RecordBatchReader.from_batches(schema, gen())


def _joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def to_physical(
    rows: pa.Table, available: Iterable[str], aliases: Mapping[str, tuple[str, ...]]
) -> pa.Table:
    """Rename harness columns to the names a source with its own schema uses (a column renamed
    in the harness keeps its physical name there)."""
    avail = set(available)
    names = [
        next((c for c in (n, *aliases.get(n, ())) if c in avail), n) for n in rows.column_names
    ]
    return rows.rename_columns(names)


def fit_to_schema(
    rows: pa.Table, schema: pa.Schema, aliases: Mapping[str, tuple[str, ...]]
) -> pa.Table:
    """Rows to append to a source with its own schema: harness names mapped to its physical
    names, columns it has but the rows lack as nulls, in its order and types."""
    data = to_physical(rows, schema.names, aliases)
    for f in schema:
        if f.name not in data.column_names:
            data = data.append_column(f.name, pa.nulls(data.num_rows, f.type))
    return data.select(schema.names).cast(schema)


def empty_reader(cols: Sequence[ColumnSpec]) -> pa.RecordBatchReader:
    return pa.RecordBatchReader.from_batches(target_schema(cols), iter(()))


def apply_residual(reader: pa.RecordBatchReader, predicate: Expr) -> pa.RecordBatchReader:
    """Keep exactly the rows ``predicate`` accepts (SQL semantics), for kinds that push down only
    part of it or none."""
    expr = to_arrow(predicate, reader.schema)

    def gen() -> Iterator[pa.RecordBatch]:
        for batch in reader:
            out = batch.filter(expr)
            if out.num_rows:
                yield out

    return pa.RecordBatchReader.from_batches(reader.schema, gen())


_LOCAL = pafs.LocalFileSystem()


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a local path or a URI (``file://``, ``s3://``, ...)."""
    if "://" in location:
        fs, path = pafs.FileSystem.from_uri(location)
        return fs, path
    return _LOCAL, location  # stateless and thread-safe; making one per call is not free


def local_path(location: str) -> str | None:
    """The local path of a file location, or None when it is not a local file."""
    if location.startswith("file:"):
        return unquote(urlsplit(location).path)
    if "://" in location or not os.path.isabs(location):
        return None
    return location


def local_file_problem(path: str) -> str | None:
    """Why the local ``path`` cannot be read as a data file (``"missing"``, ``"not a regular
    file"``: a named pipe, device, socket or directory), or None. Checked with ``os.stat``,
    never by opening it: opening a named pipe for reading blocks until a writer comes, and a
    directory would be read as a dataset of whatever files it holds."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as e:
        return f"cannot be examined ({e.strerror or type(e).__name__})"
    if not stat.S_ISREG(mode):
        return "not a regular file (a named pipe, device, socket or directory)"
    return None


def scan_dataset(request: ScanRequest, data: Any) -> pa.RecordBatchReader:
    """Read a ``pyarrow.dataset`` (or a one-shot ``RecordBatchReader``) with the request's
    projection and filter pushed into the scanner, applied exactly, conformed to the harness
    columns. Columns the data lacks are nulls; a filter on one of them is applied after."""
    import pyarrow.dataset as ds

    cols = request.columns
    mapping = physical_names(cols, data.schema.names)
    pred = pushdown(request, mapping)
    exact = pred is not None
    if pred is not None:
        # pyarrow prunes row groups by min/max that leave NaN out: push a filter that keeps
        # every NaN row it may match, and apply the exact one after when they differ.
        pred, exact = nan_safe(pred, floating_columns(data.schema))
    options = {
        "columns": sorted(set(mapping.values())),
        "filter": to_arrow(pred, data.schema) if pred is not None else None,
        "batch_size": DEFAULT_BATCH_ROWS,
    }
    if isinstance(data, pa.RecordBatchReader):
        scanner = ds.Scanner.from_batches(data, **options)
    else:
        scanner = data.scanner(use_threads=True, **options)
    out = conform(scanner_reader(scanner), cols, mapping)
    if request.predicate is not None and not exact:
        out = apply_residual(out, request.predicate)
    return out


def scanner_reader(scanner: Any) -> pa.RecordBatchReader:
    """``scanner.to_reader()``, but the scan is started and each batch fetched without the GIL:
    pyarrow's ``to_reader`` starts the scan holding it. A loaded gateway (64 readers of a
    source of hundreds of small files, one scanner each) held the GIL there in 42 % of py-spy's
    samples of who held it, while every other call (commits under a write lease included)
    waited for it."""
    return pa.RecordBatchReader.from_batches(scanner.projected_schema, scanner.to_batches())


def floating_columns(schema: pa.Schema) -> set[str]:
    return {f.name for f in schema if pa.types.is_floating(f.type)}


def read_files(
    request: ScanRequest, paths: Sequence[str], fmt: str = "parquet"
) -> pa.RecordBatchReader:
    """Files (local paths or URIs) one after the other, each through ``scan_dataset``."""
    import pyarrow.dataset as ds

    from flight_gateway.protocol.errors import Unavailable

    def one(path: str) -> pa.RecordBatchReader:
        fs, p = filesystem(path)
        try:
            return scan_dataset(request, ds.dataset(p, format=fmt, filesystem=fs))
        except (FileNotFoundError, OSError) as e:
            raise Unavailable(f"source {request.source.name!r}: cannot open a file: {e}") from e

    if len(paths) == 1:
        return one(paths[0])
    return chain_readers(target_schema(request.columns), (one(p) for p in paths))
