"""A pinned version's physical layout (DESIGN §16-§17), computed once per version.

Per source: the files of a cold kind where they are (``LaysOutFiles``), when an Iceberg reader
would read exactly the kind's rows from them (``fits.misfit``); otherwise slices: the source's
rows at its pinned state, read through its kind like any read, written as Parquet into the
slice store once per piece (``Slices``: a Kafka range in offset chunks; else the whole state)
and reused by every later version whose state shares the piece.

Slices are made under a materialization slot of the caller and gateway-wide, within the store's
disk budget; nothing half-written is ever used (temporary names, renamed whole).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from flight_gateway.catalog import TableSnapshot
from flight_gateway.core import tracing
from flight_gateway.core.context import Gateway
from flight_gateway.core.layout.fits import misfit, positions_schema
from flight_gateway.core.layout.ids import arrow_with_ids
from flight_gateway.core.layout.prefetch import prefetched
from flight_gateway.core.layout.store import Artifact, SliceStore, StoredFile
from flight_gateway.core.read.shape import column_specs
from flight_gateway.core.sources import bind, scan_request
from flight_gateway.protocol.errors import NotFound
from planners.execute import execute
from planners.kind import ColumnSpec, SourceKind
from planners.layout import POSITION_DELETES, LaidFile, LaysOutFiles, Slices

log = logging.getLogger(__name__)
ROW_GROUP_ROWS = 1 << 20
FILE_BYTES = 512 << 20  # a piece larger than this is several files
#: Slices are a local copy made on a statement's path and read again by every statement at
#: their version: written a third faster in Snappy than in zstd (TPC-H lineitem, 1.5 M rows:
#: 0.56 s against 0.86 s; TPC-DS store_sales at SF 0.01: 22 against 36 ms) and read no
#: slower by DuckDB, for ~25 % more bytes (45 MB against 35).
SLICE_CODEC = "snappy"
#: A slice's source tasks read at once (``prefetch``): a PostgreSQL source of more than
#: ``planners.postgres.split.TARGET_BYTES`` is several tasks, each its own COPY, whose server
#: side runs on a core of its own (TPC-H SF 1, lineitem's PostgreSQL quarter in four tasks:
#: 3.02-3.24 s one after another, 2.79-2.99 s two at a time, on two cores).
SLICE_READS = 2


@dataclass(frozen=True)
class SourceFiles:
    """One source of a version as files. ``key``: the identity of exactly these files (a
    manifest made for them is reused by every version with the same key)."""

    source: str
    key: str
    data: tuple[LaidFile, ...]
    deletes: tuple[LaidFile, ...] = ()
    in_place: bool = False
    #: Columns of the files in place that are no harness column (``FileLayout.other_names``).
    other_names: frozenset[str] = frozenset()


@dataclass(frozen=True)
class VersionLayout:
    table: str
    table_id: int
    version: int
    committed_at: float
    schema_id: int
    columns: tuple[ColumnSpec, ...]
    sources: tuple[SourceFiles, ...]

    @property
    def written(self) -> bool:
        return any(not s.in_place for s in self.sources)


def digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class Layouts:
    """Layouts of pinned versions over one slice store."""

    def __init__(self, gw: Gateway, store: SliceStore) -> None:
        self.gw, self.store = gw, store
        #: What a kind's ``layout`` answered per source identity and pinned state: files in
        #: place (nothing of the store in them), or None (sliced). A pinned state never
        #: changes, and each relation of a statement asks again (DuckLake's answer costs
        #: ~0.2 s: its metadata attached and read).
        self._laid: OrderedDict[str, SourceFiles | None] = OrderedDict()
        self._laid_lock = threading.Lock()

    def layout(
        self,
        snap: TableSnapshot,
        slot: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> VersionLayout:
        """``snap``'s layout; slices it needs are made under ``slot`` (the caller's
        materialization slot), and recorded as used by the version."""
        columns = column_specs(snap, snap.schema.names)
        out, keys = [], []
        with self.store.hold(snap.table_id, snap.version):
            for s in snap.sources:
                with tracing.span("layout.source", source=s.name, kind=s.kind):
                    files, used = self._source(snap, s.name, columns, slot)
                out.append(files)
                keys += used
            self.store.use(snap.table_id, snap.table, snap.version, keys)
        return VersionLayout(snap.table, snap.table_id, snap.version, snap.committed_at,
                             snap.schema.schema_id, columns, tuple(out))  # fmt: skip

    def source_files(
        self,
        snap: TableSnapshot,
        name: str,
        slot: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> SourceFiles:
        """One source of ``snap`` as files (in place, or its slices made once), recorded as
        used by the version like a whole layout (Flight SQL reads a hot source this way)."""
        columns = column_specs(snap, snap.schema.names)
        with self.store.hold(snap.table_id, snap.version):
            with tracing.span("layout.source", source=name):
                files, used = self._source(snap, name, columns, slot)
            self.store.use(snap.table_id, snap.table, snap.version, used)
        return files

    # ------------------------------------------------------------------ one source

    def _identity(self, snap: TableSnapshot, name: str, columns: Sequence[ColumnSpec]) -> str:
        s = snap.source(name)
        cols = [(c.field_id, c.name, c.type, c.aliases) for c in columns]
        return digest(snap.table_id, s.name, s.kind, s.config, s.partition, cols)

    def _source(
        self,
        snap: TableSnapshot,
        name: str,
        columns: tuple[ColumnSpec, ...],
        slot: Callable[[], AbstractContextManager[Any]],
    ) -> tuple[SourceFiles, list[str]]:
        kind, ref = bind(self.gw, snap, name)
        identity = self._identity(snap, name, columns)
        memo = digest(identity, ref.state)
        with self._laid_lock:
            known = memo in self._laid
            laid_before = self._laid.get(memo)
        if laid_before is not None:
            return laid_before, []
        if isinstance(kind, LaysOutFiles) and not known:
            request = scan_request(self.gw, snap.table, ref, columns, None, None)
            laid = kind.layout(request)
            why = misfit(laid, columns) if laid is not None else "its kind cannot lay it out"
            if laid is not None and why is None:
                key = memo
                deletes = tuple(f for f in laid.files if f.content == POSITION_DELETES)
                data = tuple(f for f in laid.files if f.content != POSITION_DELETES)
                used: list[str] = []
                if laid.deleted is not None and laid.deleted.num_rows:
                    art = self._positions(snap, key, laid.deleted, slot)
                    deletes += tuple(_laid(f, POSITION_DELETES) for f in art.files)
                    used.append(art.key)
                in_place = SourceFiles(name, key, data, deletes, True, laid.other_names)
                if not used:  # what the store holds may be swept: asked for each time
                    self._remember(memo, in_place)
                return in_place, used
            log.info("layout: %s/%s made a slice of: %s", snap.table, name, why)
            self._remember(memo, None)
        family = f"p-{identity[:24]}"
        states: Sequence[Mapping[str, Any]] = [ref.state]
        if isinstance(kind, Slices):
            states = kind.pieces(ref, self.store.states(snap.table_id, family))
        arts = [self._piece(snap, name, kind, family, identity, st, columns, slot) for st in states]
        files = tuple(_laid(f) for a in arts for f in a.files)
        key = digest(identity, [a.key for a in arts])
        return SourceFiles(name, key, files), [a.key for a in arts]

    def _remember(self, memo: str, files: SourceFiles | None) -> None:
        with self._laid_lock:
            self._laid[memo] = files
            self._laid.move_to_end(memo)
            while len(self._laid) > 1024:
                self._laid.popitem(last=False)

    def _piece(
        self,
        snap: TableSnapshot,
        name: str,
        kind: SourceKind,
        family: str,
        identity: str,
        state: Mapping[str, Any],
        columns: tuple[ColumnSpec, ...],
        slot: Callable[[], AbstractContextManager[Any]],
    ) -> Artifact:
        key = digest(identity, state)
        with self.store.making(key):
            hit = self.store.get(key)
            if hit is not None:
                return hit
            with slot(), tracing.span("layout.slice", source=name):
                self.store.check_budget(0, self.sweep)
                _, ref = bind(self.gw, snap, name, state=state)
                request = scan_request(self.gw, snap.table, ref, columns, None, None)
                readers = (
                    execute(kind, request, task, [c.name for c in columns])
                    for task in kind.plan(request)
                )
                files = self._write(snap.table_id, key, arrow_with_ids(columns), readers, "slices")
                return self.store.put(key, snap.table_id, family, files, dict(state))

    def _positions(
        self,
        snap: TableSnapshot,
        key: str,
        rows: pa.Table,
        slot: Callable[[], AbstractContextManager[Any]],
    ) -> Artifact:
        """Equality deletes resolved to positions, written once per source state."""
        key = digest(key, "positions")
        with self.store.making(key):
            hit = self.store.get(key)
            if hit is not None:
                return hit
            with slot():
                rows = rows.sort_by([("file_path", "ascending"), ("pos", "ascending")])
                reader = pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches())
                files = self._write(
                    snap.table_id, key, positions_schema(), iter([reader]), "deletes"
                )
                return self.store.put(key, snap.table_id, "positions", files)

    def _write(
        self, table_id: int, key: str, schema: pa.Schema, readers: Any, where: str
    ) -> list[StoredFile]:
        """Batches of ``readers`` as Parquet files of ``schema`` (field ids kept) in the
        store's ``where`` directory, each renamed into place whole; within the budget."""
        directory = self.store.directory(table_id, where)
        files: list[StoredFile] = []
        writer, tmp, rows, closed = None, None, 0, 0
        made: list[tuple[Any, Any, int]] = []
        token = object()  # this write's bytes so far, counted for the store's other writes
        try:
            # The next batches read while one is written, two of the source's tasks at once.
            for batch in prefetched(readers, SLICE_READS):
                if writer is None:
                    tmp = self.store.temporary(table_id, where, ".parquet")
                    writer, rows = (
                        pq.ParquetWriter(
                            tmp, schema, compression=SLICE_CODEC, store_decimal_as_integer=True
                        ),
                        0,
                    )
                writer.write_batch(_fit(batch, schema), row_group_size=ROW_GROUP_ROWS)
                rows += batch.num_rows
                assert tmp is not None
                written = tmp.stat().st_size
                # Within the budget as it is written, not only once whole: a source larger
                # than the store would fill the disk first (each batch is one row group).
                self.store.check_budget(closed + written, self.sweep, token)
                if written >= FILE_BYTES:
                    writer.close()
                    made.append((tmp, writer, rows))
                    closed += tmp.stat().st_size
                    writer, tmp = None, None
            if writer is not None:
                writer.close()
                made.append((tmp, writer, rows))
                writer, tmp = None, None
            size = sum(t.stat().st_size for t, _, _ in made)
            self.store.check_budget(size, self.sweep, token)
            for i, (t, _, n) in enumerate(made):
                final = directory / f"{key[:40]}-{i}.parquet"
                self.store.publish(t, final)
                files.append(StoredFile(str(final), final.stat().st_size, n))
            return files
        finally:
            self.store.done_writing(token)
            if writer is not None:
                writer.close()
            for t in [tmp, *(m[0] for m in made)]:
                if t is not None and t.exists():
                    t.unlink(missing_ok=True)

    # ------------------------------------------------------------------ sweeping

    def sweep(self) -> dict[str, int]:
        """Remove what no kept version of any table uses and nothing pins."""
        catalog = self.gw.catalog

        def kept(table_id: int, name: str) -> Callable[[int], bool]:
            try:
                head = catalog.head(name)
            except NotFound:  # dropped
                return lambda _v: False
            if head.table_id != table_id:
                return lambda _v: False
            return lambda v: head.min_version <= v <= head.current_version

        return self.store.sweep(kept)


def _laid(f: StoredFile, content: str = "data") -> LaidFile:
    return LaidFile(f"file://{f.path}", f.size, f.rows, content)


def _fit(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with ``schema``'s fields (ids and nullability); types as the harness's."""
    if batch.schema.equals(schema, check_metadata=True):
        return batch
    arrays = [batch.column(f.name).cast(f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
