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
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from flight_gateway.protocol.errors import Unavailable
from planners.common import chain_readers, scan_dataset, target_schema
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


def file_schemas(
    request: ScanRequest, fs: pafs.FileSystem, paths: Sequence[str], fmt: str
) -> list[pa.Schema]:
    """Each file's physical schema, read once per process; a missing file is UNAVAILABLE."""
    infos = fs.get_file_info(list(paths))
    out = []
    for path, info in zip(paths, infos, strict=True):
        if info.type == pafs.FileType.NotFound:
            raise Unavailable(f"source {request.source.name!r}: file {path!r} is missing")
        mtime = info.mtime_ns
        key = None if mtime is None else (fs.type_name, path, info.size or 0, mtime)
        out.append(_SCHEMAS.get(key, functools.partial(_schema, request, fs, path, fmt)))
    return out


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
    if fmt not in SELF_DESCRIBED or len(paths) == 1:
        groups = [(_UNREAD, [p]) for p in paths]  # each opened alone, its schema its own
    else:
        schemas = file_schemas(request, fs, paths, fmt)
        groups = runs(paths, [SameSchema(s) for s in schemas], schemas)

    def one(schema: pa.Schema, group: list[str]) -> pa.RecordBatchReader:
        if len(group) == 1:
            return scan_dataset(request, _open(request, fs, group[0], fmt))
        return scan_dataset(request, ds.dataset(group, schema=schema, format=fmt, filesystem=fs))

    return chained(request, groups, one)


class SameSchema:
    """A schema compared by names and types (metadata aside: pandas writes its own per file)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SameSchema) and self.schema.equals(other.schema)


def _schema(request: ScanRequest, fs: pafs.FileSystem, path: str, fmt: str) -> pa.Schema:
    return _open(request, fs, path, fmt).schema


def _open(request: ScanRequest, fs: pafs.FileSystem, path: str, fmt: str) -> ds.Dataset:
    try:
        return ds.dataset(path, format=fmt, filesystem=fs)
    except (FileNotFoundError, OSError, ValueError) as e:
        raise Unavailable(f"source {request.source.name!r}: cannot open {path!r}: {e}") from e
