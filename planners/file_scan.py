"""Many small files scanned as few datasets: one ``pyarrow.dataset`` per run of files that share
a physical schema, instead of one per file.

A version of a streamed-into source lists hundreds of small files between compactions. Scanning
them one dataset each (inspect the footer, make a scanner, start its scan) cost ~0.7 ms a file
against ~0.2 ms inside one dataset (200 files of 700 rows: 110-160 ms against 30-55 ms), and
the readers of such a table spent half their time there (``bench_chaos``, py-spy of the read
processes). Files may differ in schema (a column added or renamed later): each file's schema
is read once per process and cached by path, size and modification time (data files are
written once; a file replaced in place has another size or time), and each run of consecutive
files with one schema is scanned as one dataset of that schema, in the list's order.

Small files are also kept decoded (``_Decoded``), by the same key: inside one dataset a file
still cost ~0.25 ms to open, read its footer and decode (500 files of 100 rows: 124 ms, against
19 ms for the same rows kept in memory and scanned as one in-memory dataset), and a table's
readers read the same immutable files version after version. Runs of small files are scanned
from memory; a file above ``SMALL_FILE_BYTES`` on disk is read from its file each time.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from flight_gateway.protocol.errors import Unavailable
from planners.common import chain_readers, scan_dataset, target_schema
from planners.in_flight import InFlight
from planners.kind import ScanRequest

#: Formats whose files carry their own schema (CSV's is inferred per file: scanned alone).
SELF_DESCRIBED = frozenset({"parquet", "ipc", "orc"})
MAX_SCHEMAS = 100_000  # ~100 bytes an entry: schemas themselves are shared between entries

_Key = tuple[str, str, int, int]
#: A run: consecutive files (paths) read as one dataset of the first one's schema.
Run = tuple[pa.Schema, list[str]]
_UNREAD = pa.schema([])  # a run of one file: opened alone, its own schema read then


class _Schemas:
    """Each file's physical schema (field metadata included: Iceberg's field ids) by
    (filesystem, path, size, mtime), least recently used dropped past ``MAX_SCHEMAS``; equal
    schemas are kept once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_file: OrderedDict[_Key, pa.Schema] = OrderedDict()
        self._interned: dict[bytes, pa.Schema] = {}

    def get(self, key: _Key | None, read: Callable[[], pa.Schema]) -> pa.Schema:
        if key is None:
            return read()
        with self._lock:
            found = self._by_file.get(key)
            if found is not None:
                self._by_file.move_to_end(key)
                return found
        schema = read()
        with self._lock:
            if len(self._interned) > MAX_SCHEMAS:  # pathological: a schema per file
                self._interned.clear()
            schema = self._interned.setdefault(schema.serialize().to_pybytes(), schema)
            self._by_file[key] = schema
            while len(self._by_file) > MAX_SCHEMAS:
                self._by_file.popitem(last=False)
        return schema


_SCHEMAS = _Schemas()

#: Files up to this size on disk are kept decoded (``_Decoded``): the files a streaming writer
#: adds between compactions, not the compacted ones.
SMALL_FILE_BYTES = 256 << 10
#: Decoded bytes kept per process; the least recently read files are dropped past it.
DECODED_BYTES = 64 << 20
#: How long a caller waits for another one decoding the same file before it reads it itself.
READ_WAIT_S = 10.0


class _Decoded:
    """Small files' rows (every column, as the file's dataset reads them) by (filesystem,
    path, size, mtime), least recently used dropped past ``DECODED_BYTES``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._tables: OrderedDict[_Key, pa.Table] = OrderedDict()
        self._bytes = 0
        self._reading = InFlight(READ_WAIT_S)

    def get(self, key: _Key, read: Callable[[], pa.Table]) -> pa.Table:
        """The file's rows, decoded by one caller at a time (``InFlight``)."""

        def make() -> pa.Table:
            table = read()
            self._keep(key, table)
            return table

        return self._reading.get(key, lambda: self._lookup(key), make)

    def _lookup(self, key: _Key) -> pa.Table | None:
        with self._lock:
            found = self._tables.get(key)
            if found is not None:
                self._tables.move_to_end(key)
            return found

    def _keep(self, key: _Key, table: pa.Table) -> None:
        size = table.nbytes
        if size > self.limit // 16:  # rows that decode large: read from the file each time
            return
        with self._lock:
            if key not in self._tables:
                self._tables[key] = table
                self._bytes += size
            while self._bytes > self.limit:
                _, dropped = self._tables.popitem(last=False)
                self._bytes -= dropped.nbytes


_DECODED = _Decoded(DECODED_BYTES)


@dataclass(frozen=True)
class Listed:
    """A file of a read: its path, its cache key (None when its filesystem gives no
    modification time), its size and its physical schema."""

    path: str
    key: _Key | None
    size: int
    schema: pa.Schema

    @property
    def small(self) -> bool:
        return self.key is not None and self.size <= SMALL_FILE_BYTES


def listed(
    request: ScanRequest, fs: pafs.FileSystem, paths: Sequence[str], fmt: str
) -> list[Listed]:
    """Each file of ``paths`` with its physical schema, read once per process; a missing file
    is UNAVAILABLE."""
    infos = fs.get_file_info(list(paths))
    out = []
    for path, info in zip(paths, infos, strict=True):
        if info.type == pafs.FileType.NotFound:
            raise Unavailable(f"source {request.source.name!r}: file {path!r} is missing")
        mtime, size = info.mtime_ns, info.size or 0
        key = None if mtime is None else (fs.type_name, path, size, mtime)
        schema = _SCHEMAS.get(key, functools.partial(_schema, request, fs, path, fmt))
        out.append(Listed(path, key, size, schema))
    return out


def run_dataset(
    request: ScanRequest, fs: pafs.FileSystem, files: Sequence[Listed], schema: pa.Schema,
    fmt: str,
) -> ds.Dataset:  # fmt: skip
    """A run of files of one physical ``schema`` as one dataset: in memory when every file is
    small (each decoded once per process), else over the files."""
    if not all(f.small for f in files):
        return ds.dataset([f.path for f in files], schema=schema, format=fmt, filesystem=fs)
    tables = [
        _DECODED.get(f.key, functools.partial(_decode, request, fs, f.path, fmt))  # type: ignore[arg-type]
        for f in files
    ]
    # Names and types are equal (``SameSchema``); field metadata may differ (concatenated
    # all the same: the first file's is kept, as a dataset over the files keeps ``schema``'s).
    return ds.dataset(pa.concat_tables(tables))


def runs(paths: Sequence[str], keys: Sequence[object], schemas: Sequence[pa.Schema]) -> list[Run]:
    """Consecutive paths with equal ``keys``, each run with its first file's schema."""
    out: list[Run] = []
    last: object = object()
    for path, key, schema in zip(paths, keys, schemas, strict=True):
        if out and key == last:
            out[-1][1].append(path)
        else:
            out.append((schema, [path]))
        last = key
    return out


def chained(
    request: ScanRequest,
    groups: list[Run],
    one: Callable[[pa.Schema, list[str]], pa.RecordBatchReader],
) -> pa.RecordBatchReader:
    """``one`` of each run (conformed to the harness columns), one after the other."""
    if len(groups) == 1:
        return one(*groups[0])

    def readers() -> Iterator[pa.RecordBatchReader]:
        for schema, group in groups:
            yield one(schema, group)

    return chain_readers(target_schema(request.columns), readers())


def scan_files(
    request: ScanRequest, fs: pafs.FileSystem, paths: Sequence[str], fmt: str
) -> pa.RecordBatchReader:
    """The rows of ``paths`` (in order) through ``scan_dataset``: runs of files sharing a
    schema (names and types) as one dataset each. A missing or unreadable file is
    UNAVAILABLE."""
    by_path: dict[str, Listed] = {}
    if fmt not in SELF_DESCRIBED or len(paths) == 1:
        groups = [(_UNREAD, [p]) for p in paths]  # each opened alone, its schema its own
    else:
        files = listed(request, fs, paths, fmt)
        by_path = {f.path: f for f in files}
        groups = runs(paths, [(SameSchema(f.schema), f.small) for f in files],
                      [f.schema for f in files])  # fmt: skip

    def one(schema: pa.Schema, group: list[str]) -> pa.RecordBatchReader:
        if schema is _UNREAD:
            return scan_dataset(request, _open(request, fs, group[0], fmt))
        members = [by_path[p] for p in group]
        return scan_dataset(request, run_dataset(request, fs, members, schema, fmt))

    return chained(request, groups, one)


class SameSchema:
    """A schema compared by names and types (metadata aside: pandas writes its own per file)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SameSchema) and self.schema.equals(other.schema)


def _schema(request: ScanRequest, fs: pafs.FileSystem, path: str, fmt: str) -> pa.Schema:
    return _open(request, fs, path, fmt).schema


def _decode(request: ScanRequest, fs: pafs.FileSystem, path: str, fmt: str) -> pa.Table:
    try:
        return _open(request, fs, path, fmt).to_table()
    except (FileNotFoundError, OSError) as e:  # removed since it was listed
        raise Unavailable(f"source {request.source.name!r}: cannot read {path!r}: {e}") from e


def _open(request: ScanRequest, fs: pafs.FileSystem, path: str, fmt: str) -> ds.Dataset:
    try:
        return ds.dataset(path, format=fmt, filesystem=fs)
    except (FileNotFoundError, OSError, ValueError) as e:
        raise Unavailable(f"source {request.source.name!r}: cannot open {path!r}: {e}") from e
