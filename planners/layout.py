"""A pinned source state as files (DESIGN §16-§17): the capabilities a kind adds so that a
version's data can be handed to engines that read files themselves (the Iceberg REST face).

- ``LaysOutFiles``: cold kinds whose pinned data *is* a set of Parquet files an Iceberg reader
  can read where they are (``files`` of Parquet, Iceberg data and delete files, Delta). The kind
  lists them, with what a reader needs to map their columns; the gateway checks that an Iceberg
  reader would read exactly the rows the kind's own ``read`` returns, and otherwise makes a
  slice of the source instead.
- ``Slices``: kinds whose pinned data is materialized (Kafka ranges, versioned PostgreSQL rows,
  DuckLake, CSV files) may cut it into pieces, each a sub-state read with the kind's own
  ``read`` and stored once, so a later state that shares pieces reuses them (a Kafka range is
  cut at offsets, so a version that adds messages writes only the new ones). A kind without it
  is one piece per state.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.fs as pafs

from flight_gateway.protocol.errors import Unavailable
from planners.kind import ColumnSpec, ScanRequest, SourceRef

DATA = "data"
POSITION_DELETES = "position_deletes"


@dataclass(frozen=True)
class LaidFile:
    """One file of a pinned source, read where it is. ``path``: an absolute URI (``file://``
    for local files). ``stats``: Iceberg column statistics keyed by field id, when the kind has
    them (``value_counts``, ``null_value_counts``, ``nan_value_counts``, ``lower_bounds`` and
    ``upper_bounds`` as Iceberg's binary single values, ``column_sizes``)."""

    path: str
    size: int
    record_count: int
    content: str = DATA
    stats: Mapping[str, Mapping[int, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class FileLayout:
    """A pinned source state as files.

    ``field_ids``: harness column name -> the Parquet field id its files carry (files written
    by Iceberg); empty when files carry no ids and columns are matched by name (``physical``).
    ``physical``: harness column name -> (the column's name in the files, its Arrow type
    there), for every harness column the files hold; a column missing here reads as NULL.
    ``deleted``: rows to leave out beyond the files' own delete files, as position deletes
    (``file_path``, ``pos``): e.g. Iceberg equality deletes resolved to the rows they match.
    ``other_names``: see below.
    """

    files: tuple[LaidFile, ...]
    physical: Mapping[str, tuple[str, pa.DataType]]
    field_ids: Mapping[str, int] = field(default_factory=dict)
    #: Every field id the files may carry, mapped or not (ids given to other columns must
    #: avoid them: a reader would take such a column for that one).
    file_ids: frozenset[int] = frozenset()
    deleted: pa.Table | None = None
    #: Names of columns the files hold that are no harness column (files read by name): an
    #: Iceberg reader must find every column of a file in the name mapping (pyiceberg refuses
    #: a file with an unmapped one), so these are mapped to ids no column has.
    other_names: frozenset[str] = frozenset()


@runtime_checkable
class LaysOutFiles(Protocol):
    """Kinds whose pinned data is files an Iceberg reader can read in place. ``layout`` gets a
    request for every harness column (no predicate) and returns the files, or None when the
    state cannot be read that way (a format other than Parquet, partition values that live
    outside the files, deletion vectors): the gateway then makes a slice of it."""

    def layout(self, request: ScanRequest) -> FileLayout | None: ...


@runtime_checkable
class Slices(Protocol):
    """Kinds whose pinned state is materialized in pieces. ``pieces`` returns sub-states of
    ``source.state`` whose reads together return exactly the state's rows, each read alone with
    the kind's ``read``; ``stored``: the sub-states already materialized for this source (to
    reuse where they fit)."""

    def pieces(
        self, source: SourceRef, stored: Sequence[Mapping[str, Any]]
    ) -> list[Mapping[str, Any]]: ...


def name_mapping(columns: Sequence[ColumnSpec]) -> dict[str, int]:
    """Physical name -> column id for files without field ids: current names first, then
    former names (a name another column now has belongs to that column)."""
    out = {c.name: c.field_id for c in columns}
    for c in columns:
        for alias in c.aliases:
            out.setdefault(alias, c.field_id)
    return out


def widens(have: pa.DataType, want: pa.DataType) -> bool:
    """An Iceberg reader reads ``have`` as ``want`` without changing a value."""
    if have == want:
        return True
    t = pa.types
    if t.is_string(want) or t.is_large_string(want):
        return t.is_string(have) or t.is_large_string(have)
    if t.is_binary(want) or t.is_large_binary(want):
        return t.is_binary(have) or t.is_large_binary(have)
    if t.is_signed_integer(want) and t.is_signed_integer(have):
        return have.bit_width <= want.bit_width
    if t.is_float64(want):
        return t.is_float32(have)
    if t.is_decimal(want) and t.is_decimal(have):
        return have.scale == want.scale and have.precision <= want.precision
    if t.is_timestamp(want) and t.is_timestamp(have):
        # Iceberg v2 timestamps are microseconds; with or without a zone must agree.
        return have.unit == want.unit == "us" and (have.tz is None) == (want.tz is None)
    return False


def as_uri(location: str) -> str:
    """A location as an absolute URI: local paths become ``file://`` URIs."""
    return location if "://" in location else f"file://{location}"


_FIELD_ID = b"PARQUET:field_id"
_footers: OrderedDict[tuple[str, int, int], tuple[int, int, pa.Schema] | None] = OrderedDict()
_footers_lock = threading.Lock()


def parquet_footer(fs: pafs.FileSystem, path: str) -> tuple[int, int, pa.Schema] | None:
    """(size, rows, Arrow schema) of a Parquet file, or None when it carries field ids (an
    Iceberg reader would map its columns by them, not by name). Footers are kept per
    (path, size, mtime): a state that adds one file reads one footer."""
    import pyarrow.parquet as pq

    info = fs.get_file_info(path)
    if info.type != pafs.FileType.File:  # removed after its commit, or no regular file
        raise Unavailable(f"file {path!r} of the pinned state is missing or not a file")
    key = (path, int(info.size or 0), int(info.mtime_ns or 0))
    with _footers_lock:
        if key in _footers:
            _footers.move_to_end(key)
            return _footers[key]
    with fs.open_input_file(path) as f:
        meta = pq.read_metadata(f)
    schema = meta.schema.to_arrow_schema()
    ids = any(fld.metadata and _FIELD_ID in fld.metadata for fld in schema)
    out = None if ids else (key[1], int(meta.num_rows), schema)
    with _footers_lock:
        _footers[key] = out
        while len(_footers) > 100_000:
            _footers.popitem(last=False)
    return out
