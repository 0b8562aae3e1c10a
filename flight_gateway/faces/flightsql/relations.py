"""What DuckDB scans for one harness table of a statement: the table planned once at its pinned
version (every reference of the statement shares it), each source as the relation its kind
describes (``ScansInEngine``: pinned Parquet files, a PostgreSQL query) or, for the others, the
harness stream of its tasks, opened lazily and never materialised by the gateway."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flight_gateway.catalog import TableSnapshot
from flight_gateway.core.read.plain import plan_sources
from flight_gateway.core.read.shape import arrow_schema, candidate_sources, column_specs, resolve
from flight_gateway.protocol import ReadRequest
from flight_gateway.protocol.errors import InvalidArgument, Unavailable
from planners.common import local_file_problem, local_path
from planners.execute import execute
from planners.kind import ColumnSpec, EngineScan, ParquetScan, ScansInEngine, ScanTask, SourceKind

if TYPE_CHECKING:
    from flight_gateway.core.layout import Layouts
    from flight_gateway.core.read import ReadService

log = logging.getLogger(__name__)
_GLOB = re.compile(r"[*?\[\]{}]")


@dataclass
class Part:
    """One source of a table: ``scan`` for the engine, else ``open`` gives its stream."""

    source: str
    kind: str
    tasks: int
    scan: EngineScan | None = None
    open: Callable[[], pa.RecordBatchReader] | None = None
    #: The Parquet footers' top-level (name, field id) per file of ``scan``, read by the first
    #: statement that builds a view over this part (pinned files do not change).
    footers: dict[str, list[tuple[str, int | None]]] | None = None


@dataclass
class TableRelation:
    table: str
    version: int
    columns: tuple[ColumnSpec, ...]  # the harness columns the statement uses, in table order
    schema: pa.Schema  # their Arrow types
    parts: list[Part] = field(default_factory=list)
    filter: str | None = None
    pruned: list[str] = field(default_factory=list)  # sources the filter rules out
    duck_types: list[str] | None = None  # DuckDB's name of each column's type, once known
    uses: int = 0  # statements that read it (a cached relation serves many)

    @property
    def hot(self) -> bool:
        """Some source is read from its server or as a stream (not as Parquet in place)."""
        return any(not isinstance(p.scan, ParquetScan) for p in self.parts)

    @property
    def file_count(self) -> int:
        """How many files the engine scans in place or as slices for it."""
        return sum(len(p.scan.files) for p in self.parts if isinstance(p.scan, ParquetScan))

    def report(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "version": self.version,
            "columns": self.schema.names,
            "filter": self.filter,
            "sources": [
                {
                    "name": p.source,
                    "kind": p.kind,
                    "pruned": False,
                    "tasks": p.tasks,
                    "scan": type(p.scan).__name__ if p.scan is not None else "stream",
                }
                for p in self.parts
            ]
            + [{"name": name, "pruned": True, "tasks": 0} for name in self.pruned],
        }


def _accepted(snap: TableSnapshot, conjuncts: Sequence[str]) -> list[str]:
    """The conjuncts the harness filter language takes (the others stay DuckDB's alone)."""
    out = []
    for c in conjuncts:
        try:
            resolve(snap, None, c)
        except InvalidArgument:
            continue
        out.append(c)
    return out


def prunes_sources(snap: TableSnapshot, filter_text: str) -> bool:
    """Whether ``filter_text`` rules out a source of ``snap`` by its partition values."""
    try:
        shape = resolve(snap, None, filter_text)
    except InvalidArgument:
        return False
    left = candidate_sources(snap, ReadRequest(table=snap.table), shape.predicate)
    return len(left) < len(snap.sources)


def combined_filter(snap: TableSnapshot, filters: Sequence[Sequence[str]]) -> str | None:
    """One filter for a table several references share: a row any of them may need passes
    (each reference's own conjuncts still apply in the statement)."""
    kept = [_accepted(snap, f) for f in filters]
    if not kept or any(not f for f in kept):
        return None
    ors = [" AND ".join(f"({c})" for c in conj) for conj in kept]
    unique = list(dict.fromkeys(ors))
    return unique[0] if len(unique) == 1 else " OR ".join(f"({o})" for o in unique)


def _chain(
    schema: pa.Schema, kind: SourceKind, request: Any, tasks: Sequence[ScanTask], output: list[str]
) -> Callable[[], pa.RecordBatchReader]:
    def open_() -> pa.RecordBatchReader:
        def gen() -> Iterator[pa.RecordBatch]:
            for task in tasks:  # one task open at a time
                reader = execute(kind, request, task, output)
                try:
                    yield from reader
                finally:
                    reader.close()

        return pa.RecordBatchReader.from_batches(schema, gen())

    return open_


def _local(scan: EngineScan | None) -> EngineScan | None:
    """Parquet scans with local paths; None (stream it) for files in remote storage, whose
    credentials the engine does not hold."""
    if not isinstance(scan, ParquetScan):
        return scan
    paths = [local_path(f) for f in scan.files]
    if any(p is None or _GLOB.search(p) for p in paths):
        return None  # DuckDB would read a name with * ? [ ] { } as a pattern: stream it
    return ParquetScan(tuple(p for p in paths if p), scan.field_ids)


def check_files(rels: Sequence[TableRelation]) -> None:
    """UNAVAILABLE when a file the engine would scan in place is missing or no longer a
    regular file: a relation is planned once per version and kept, and a file replaced since
    by a named pipe would block DuckDB's open of it until a writer came. ``stat`` only (a
    few microseconds a file), never opened."""
    for rel in rels:
        for part in rel.parts:
            if not isinstance(part.scan, ParquetScan):
                continue
            for path in part.scan.files:
                why = local_file_problem(path)
                if why is not None:
                    raise Unavailable(f"table {rel.table!r}: file {path!r} is {why}")


def empty_relation(snap: TableSnapshot, columns: Sequence[str]) -> TableRelation:
    """``columns`` of ``snap`` with no rows (typing a statement's result plans nothing)."""
    specs = column_specs(snap, columns)
    return TableRelation(snap.table, snap.version, specs, arrow_schema(snap.schema, columns))


def plan_table(
    reads: ReadService,
    snap: TableSnapshot,
    columns: Sequence[str],
    filter_text: str | None,
    engine_scans: bool = True,
) -> TableRelation:
    """Plan ``columns`` of ``snap`` for the engine; ``filter_text`` prunes sources and files
    only (the statement applies its own filter)."""
    try:
        shape = resolve(snap, columns, filter_text)
    except InvalidArgument:  # a conjunct the harness filter language cannot take
        shape, filter_text = resolve(snap, columns, None), None
    schema = arrow_schema(snap.schema, shape.projection)
    specs = column_specs(snap, shape.projection)
    out = TableRelation(snap.table, snap.version, specs, schema, filter=filter_text)
    for sp in plan_sources(reads.gw, snap, ReadRequest(table=snap.table), shape):
        if sp.kind is None or sp.request is None:
            out.pruned.append(sp.name)
            continue
        if not sp.tasks:
            continue
        scan = None
        if engine_scans and isinstance(sp.kind, ScansInEngine):
            scan = _local(sp.kind.engine_scan(sp.request, sp.tasks))
        part = Part(sp.name, sp.kind_name, len(sp.tasks), scan)
        if scan is None:
            part.open = _chain(schema, sp.kind, sp.request, sp.tasks, list(shape.projection))
        out.parts.append(part)
    return out


def narrowed(rel: TableRelation, columns: Sequence[str]) -> TableRelation:
    """``rel`` (planned over its table's columns, every source read by the engine from
    files) read for ``columns`` only: its files and footers shared (its DuckDB types too,
    when known)."""
    index = {c.name: i for i, c in enumerate(rel.columns)}
    picked = [index[c] for c in columns]
    types = None if rel.duck_types is None else [rel.duck_types[i] for i in picked]
    return replace(
        rel,
        columns=tuple(rel.columns[i] for i in picked),
        schema=pa.schema([rel.schema.field(i) for i in picked]),
        duck_types=types,
        uses=0,
    )


def sliced(rel: TableRelation, snap: TableSnapshot, layouts: Layouts) -> TableRelation:
    """``rel`` with each source read from a server or as a stream replaced by its pinned
    rows as Parquet slices (DESIGN §17: made once per pinned state, in the slice store the
    Iceberg REST face uses too), scanned by the engine like files in place. A source whose
    layout carries deletes keeps its own scan."""
    field_ids = {c.name: c.field_id for c in rel.columns}
    parts = []
    for p in rel.parts:
        if isinstance(p.scan, ParquetScan):
            parts.append(p)
            continue
        files = layouts.source_files(snap, p.source)
        paths = [local_path(f.path) for f in files.data]
        if files.deletes or any(path is None or _GLOB.search(path) for path in paths):
            parts.append(p)  # DuckDB would read * ? [ ] { } in a name as a pattern
            continue
        scan = ParquetScan(tuple(path for path in paths if path), field_ids)
        parts.append(Part(p.source, p.kind, p.tasks, scan))
    return replace(rel, parts=parts, uses=rel.uses)
