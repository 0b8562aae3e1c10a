"""Merge-on-read of Iceberg equality deletes (pyiceberg 0.12 plans and applies position deletes
only, and refuses equality deletes).

Planning runs pyiceberg's own manifest planner with an entry filter that takes the equality
delete files aside and records each data file's data sequence number; a delete file applies to
a data file with a strictly lower data sequence number in the same partition (or to every data
file when the delete file's spec is unpartitioned), as the spec says.

Reading applies them as one anti-join per group of data files that share the same delete files
(Upsolver's plan), never per batch. The key set of a delete file is decoded once per process
and kept in a bounded cache: a delete file is immutable, so every task of every read of a
snapshot shares it, instead of each task reading every delete file again.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from planners.iceberg_manifests import cached

log = logging.getLogger(__name__)

#: Decoded key rows kept across reads (a bound on memory, not a correctness limit).
CACHE_ROWS = 20_000_000
_cache: OrderedDict[str, pa.Table] = OrderedDict()
_cache_rows = 0
_cache_lock = threading.Lock()
_loading: dict[str, threading.Lock] = {}
_FIELD_ID = b"PARQUET:field_id"


@dataclass(frozen=True)
class Planned:
    """pyiceberg's scan tasks (position deletes attached) and, per data file path, the
    equality delete files that apply to it."""

    tasks: list[Any]
    equality: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def deletes_for(self, path: str) -> tuple[Any, ...]:
        return self.equality.get(path, ())

    def key_field_ids(self) -> set[int]:
        return {int(i) for files in self.equality.values() for f in files for i in f.equality_ids}


def plan(scan: Any) -> Planned:
    """Plan ``scan`` (a pyiceberg ``DataScan``) with its equality delete files."""
    from pyiceberg.manifest import DataFileContent

    snapshot = scan.snapshot()
    if snapshot is None:
        return Planned([])
    sequence: dict[str, int] = {}
    equality: list[tuple[int, Any]] = []

    def keep(entry: Any) -> bool:  # called once per entry, in the planning thread
        f = entry.data_file
        if f.content == DataFileContent.EQUALITY_DELETES:
            equality.append((int(entry.sequence_number or 0), f))
            return False
        if f.content == DataFileContent.DATA:
            sequence[f.file_path] = int(entry.sequence_number or 0)
        return True

    planner = scan._manifest_planner  # pyiceberg 0.12: the planner DataScan.plan_files uses
    manifests = cached(snapshot.manifests(scan.io))  # entries decoded once per process
    tasks = list(planner.plan_files(manifests, manifest_entry_filter=keep))
    if not equality:
        return Planned(tasks)
    specs = scan.table_metadata.specs()
    applies: dict[str, tuple[Any, ...]] = {}
    for t in tasks:
        seq = sequence.get(t.file.file_path, 0)
        mine = tuple(f for s, f in equality if s > seq and _same_partition(f, t.file, specs))
        if mine:
            applies[t.file.file_path] = mine
    return Planned(tasks, applies)


def _same_partition(delete: Any, data: Any, specs: Any) -> bool:
    spec = specs.get(delete.spec_id)
    if spec is None or not spec.fields:
        return True  # an unpartitioned delete file applies to the whole table
    return bool(delete.spec_id == data.spec_id and delete.partition == data.partition)


def _decode(io: Any, schema: Any, delete: Any) -> pa.Table:
    """The delete file's key rows, columns named as in ``schema`` (found by field id)."""
    import pyarrow.parquet as pq

    with io.new_input(delete.file_path).open() as f:
        table = pq.read_table(f)
    by_id = {}
    for i, fld in enumerate(table.schema):
        if fld.metadata and _FIELD_ID in fld.metadata:
            by_id[int(fld.metadata[_FIELD_ID])] = i
    columns, names = [], []
    for fid in delete.equality_ids:
        name = schema.find_field(int(fid)).name
        idx = by_id.get(int(fid), table.schema.get_field_index(name))
        if idx < 0:
            raise ValueError(f"equality delete file {delete.file_path} lacks field id {fid}")
        columns.append(table.column(idx))
        names.append(name)
    return pa.table(columns, names=names)


def delete_keys(io: Any, schema: Any, delete: Any) -> pa.Table:
    """``_decode`` through the process-wide cache (keyed by path: delete files never change).
    Concurrent tasks needing the same file wait for one decode instead of each doing it."""
    global _cache_rows
    key = f"{delete.file_path}\0{list(delete.equality_ids)}"
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
        loading = _loading.setdefault(key, threading.Lock())
    with loading:
        with _cache_lock:
            hit = _cache.get(key)
        if hit is not None:
            return hit
        keys = _decode(io, schema, delete)
        with _cache_lock:
            _cache[key] = keys
            _loading.pop(key, None)
            _cache_rows += keys.num_rows
            while _cache_rows > CACHE_ROWS and len(_cache) > 1:
                _, old = _cache.popitem(last=False)
                _cache_rows -= old.num_rows
    return keys


def anti_join(data: pa.Table, io: Any, schema: Any, deletes: Sequence[Any]) -> pa.Table:
    """``data`` without the rows any of ``deletes`` matches (one pass per key column set)."""
    by_ids: dict[tuple[int, ...], list[pa.Table]] = {}
    for d in deletes:
        by_ids.setdefault(tuple(int(i) for i in d.equality_ids), []).append(
            delete_keys(io, schema, d)
        )
    for tables in by_ids.values():
        keys = pa.concat_tables(tables, promote_options="permissive")
        names = keys.column_names
        if len(names) == 1:
            # NULL matches NULL in an equality delete: is_in with nulls counted does that.
            column = data.column(names[0])
            values = keys.column(0).cast(column.type)
            hit = pc.is_in(column, value_set=values.combine_chunks(), skip_nulls=False)
            data = data.filter(pc.invert(hit))
        else:
            keys = keys.group_by(names).aggregate([])
            cast = pa.table(
                [keys.column(n).cast(data.schema.field(n).type) for n in names], names=names
            )
            data = data.join(cast, keys=names, join_type="left anti")
    return data


def read_task(scan: Any, planned: Planned, files: Sequence[Any]) -> Iterator[pa.RecordBatch]:
    """Batches of ``files`` (pyiceberg ``FileScanTask``s) with position and equality deletes
    applied: files that share delete files are read together and anti-joined once."""
    from pyiceberg.io.pyarrow import ArrowScan

    reader = ArrowScan(
        scan.table_metadata, scan.io, scan.projection(), scan.row_filter, scan.case_sensitive
    )
    groups: dict[tuple[str, ...], list[Any]] = {}
    for t in files:
        paths = tuple(sorted(d.file_path for d in planned.deletes_for(t.file.file_path)))
        groups.setdefault(paths, []).append(t)
    # Key names as the pinned snapshot's read schema has them (a later rename must not matter).
    full = scan.projection()
    for paths, group in groups.items():
        if not paths:
            yield from reader.to_record_batches(group)
            continue
        data = reader.to_table(group)
        deletes = planned.deletes_for(group[0].file.file_path)
        before = data.num_rows
        data = anti_join(data, scan.io, full, deletes)
        log.debug("equality deletes removed %d of %d rows", before - data.num_rows, before)
        yield from data.to_batches()


def deleted_positions(io: Any, schema: Any, data_file: Any, deletes: Sequence[Any]) -> pa.Array:
    """Row positions in ``data_file`` (a pyiceberg ``DataFile``) that ``deletes`` (equality
    delete files that apply to it) match: the same rows ``anti_join`` leaves out, as positions,
    so a reader that applies only position deletes reads the same rows."""
    import pyarrow.parquet as pq

    ids = sorted({int(i) for d in deletes for i in d.equality_ids})
    with io.new_input(data_file.file_path).open() as f:
        pf = pq.ParquetFile(f)
        arrow = pf.schema_arrow
        by_id = {
            int(fld.metadata[_FIELD_ID]): fld.name
            for fld in arrow
            if fld.metadata and _FIELD_ID in fld.metadata
        }
        names = {i: by_id.get(i, schema.find_field(i).name) for i in ids}
        present = [n for n in names.values() if n in arrow.names]
        data = pf.read(columns=present) if present else pa.table({})
    columns = {
        schema.find_field(i).name: (
            data.column(names[i]) if names[i] in data.column_names
            else pa.nulls(pf.metadata.num_rows, pa.null())  # a column added after the file
        )
        for i in ids
    }  # fmt: skip
    keyed = pa.table(columns) if columns else pa.table({})
    positions = pa.array(range(pf.metadata.num_rows), pa.int64())
    keyed = keyed.append_column("__pos", positions)
    kept = anti_join(keyed, io, schema, deletes)
    gone = pc.invert(pc.is_in(positions, value_set=kept.column("__pos").combine_chunks()))
    return positions.filter(gone)
