"""``hudi`` sources: one Apache Hudi table (hudi-rs, ``hudi``) read at a pinned commit instant.

Config: ``uri`` (a path or ``s3://``/``gs://``/``az://`` URI of the table's base path) and
optional ``storage_options`` (hudi-rs storage and ``hoodie.*`` read options). State:
``{"instant": "<requested time of a completed commit>" | null}`` (null: no commit published
yet, so no rows). The instant is what Spark's ``as.of.instant`` takes.

Planning asks hudi-rs for the file slices visible at the instant (the latest base file of each
file group, and its log files on merge-on-read tables), with the pushed-down filter's simple
conjuncts as hudi-rs filters: partition pruning on every table, footer-statistics pruning on
copy-on-write ones. Slices are grouped into tasks by size and named in tickets by their files.

Reading: a slice without log files written at or before the instant is its base Parquet file,
read with pyarrow (projection and filter pushed into the scan, applied exactly); those are
also what direct tasks and the SQL engine's Parquet scan read. A slice with such log files is
merged by hudi-rs's file group reader at the instant (merge on read: updates and deletes from
Avro log blocks). What hudi-rs cannot read is refused by it with an error, never read wrongly:
see docs/sources.md for the limits (the metadata table is not used for listing, bootstrap and
Hudi's own partition-column dropping read through hudi-rs only).

No writes: the harness pins commits that Spark, Flink or Hudi's streamers made. Streaming
(``since``): the records whose ``_hoodie_commit_time`` is after the earlier instant, from the
file slices hudi-rs's incremental query lists: inserts once each; an upserted record again
(Hudi's incremental semantics: the record's newest value).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from flight_gateway.protocol.errors import InvalidArgument, NotFound, Unavailable
from planners import locations
from planners.common import (
    DEFAULT_BATCH_ROWS,
    apply_residual,
    chain_readers,
    conform,
    filesystem,
    group_by_size,
    physical_names,
    pushdown,
    scan_dataset,
    target_schema,
)
from planners.kind import (
    DirectFiles,
    EngineScan,
    Reach,
    ScanRequest,
    ScanTask,
    SourceConfig,
    SourceKind,
    SourceRef,
    parquet_engine_scan,
)
from planners.layout import FileLayout, LaidFile, as_uri, parquet_footer
from planners.predicates import conjuncts
from planners.predicates.ast import Cmp, In

log = logging.getLogger(__name__)
_INSTANT = re.compile(r"^\d{8,20}$")
#: A log file's name: ``.<file id>_<instant>.log.<version>_<write token>``.
_LOG = re.compile(r"^\.(?P<file_id>.+)_(?P<instant>\d+)\.log\.\d+(_.*)?$")
#: A base file's name: ``<file id>_<write token>_<instant>.<extension>``.
_BASE = re.compile(r"^.+_(?P<instant>\d+)\.[a-z]+$")
COMMIT_TIME = "_hoodie_commit_time"
#: hudi-rs filter operators for the harness's comparison operators.
_OPS = {"=": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


@dataclass(frozen=True, kw_only=True)
class HudiConfig(SourceConfig):
    #: Path or URI of the Hudi table's base path.
    uri: str
    #: hudi-rs options (object store credentials and endpoints, ``hoodie.*`` read options);
    #: may use ``${NAME}`` references.
    storage_options: dict[str, str] = field(default_factory=dict)


def _instant(source: str, state: Mapping[str, Any]) -> str | None:
    v = state.get("instant")
    if v is not None and (not isinstance(v, str) or not _INSTANT.match(v)):
        raise InvalidArgument(
            f"source {source!r}: instant must be a Hudi instant time (digits), got {v!r}"
        )
    return v


#: hudi-rs storage options naming a network endpoint; other network-like keys are refused.
STORAGE_NETWORK = {
    **locations.OBJECT_STORE_ENDPOINTS,
    "hoodie.base.path": "storage",  # would move the table elsewhere: checked like ``uri``
}


@dataclass(frozen=True)
class _Pinned:
    """A table at one instant: what every plan and read at that instant shares."""

    table: Any  # hudi.HudiTable
    schema: pa.Schema  # the data columns, without Hudi's meta columns
    #: Partition columns are stored in the base files (Hudi's default): files are whole rows.
    files_hold_partitions: bool
    #: Records carry ``_hoodie_commit_time`` (Hudi's default), which streaming reads need.
    meta_fields: bool
    root: str
    #: Log file names carry the instant of the delta commit that wrote them (table version 8
    #: and later); before, the instant of their file slice's base file.
    logs_named_by_commit: bool = True


_pinned: OrderedDict[str, _Pinned] = OrderedDict()
_lock = threading.Lock()


def _open(source: SourceRef, config: HudiConfig, instant: str) -> _Pinned:
    """The table at ``instant``; an instant never changes, so it is opened once per instant."""
    key = json.dumps([config.uri, config.storage_options, instant], sort_keys=True)
    with _lock:
        hit = _pinned.get(key)
        if hit is not None:
            _pinned.move_to_end(key)
            return hit
    pinned = _load(source, config, instant)
    with _lock:
        _pinned[key] = pinned
        while len(_pinned) > 64:
            _pinned.popitem(last=False)
    return pinned


def _load(source: SourceRef, config: HudiConfig, instant: str) -> _Pinned:
    from hudi import HudiTable

    try:
        table = HudiTable(config.uri, config.storage_options or None)
        timeline = table.get_timeline()
        done = {
            i.timestamp
            for i in (
                *timeline.get_completed_commits(),
                *timeline.get_completed_deltacommits(),
                *timeline.get_completed_replacecommits(),
            )
        }
    except Exception as e:  # hudi-rs raises its own errors for a missing or unreadable table
        raise Unavailable(f"source {source.name!r}: cannot open the Hudi table: {e}") from e
    if instant not in done:
        raise NotFound(
            f"source {source.name!r}: instant {instant} is not a completed commit of the Hudi "
            "table (never made, still in flight, or archived)"
        )
    try:
        options = table.hudi_options()
        schema = pa.schema(table.get_schema())
    except Exception as e:
        raise Unavailable(
            f"source {source.name!r}: cannot read the Hudi table's schema: {e}"
        ) from e
    if options.get("hoodie.bootstrap.base.path"):
        # Its base files live under another path that hudi-rs would open unchecked.
        raise InvalidArgument(f"source {source.name!r}: bootstrapped Hudi tables are not supported")
    dropped = options.get("hoodie.datasource.write.drop.partition.columns", "false") == "true"
    meta = options.get("hoodie.populate.meta.fields", "true") != "false"
    root = config.uri.rstrip("/")
    version = options.get("hoodie.table.version", "")
    by_commit = not version.isdigit() or int(version) >= 8
    return _Pinned(table, schema, not dropped, meta, root, by_commit)


def _read_options(instant: str, **extra: Any) -> Any:
    from hudi import HudiReadOptions

    return HudiReadOptions(**extra).with_as_of_timestamp(instant)


def hudi_filters(request: ScanRequest, mapping: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """The predicate's simple conjuncts (column op literal, IN) as hudi-rs filters, for pruning
    only (the exact predicate is applied when reading)."""
    pred = pushdown(request, mapping)
    out: list[tuple[str, str, str]] = []
    for c in conjuncts(pred) if pred is not None else ():
        if isinstance(c, Cmp) and c.op in _OPS and _literal(c.value):
            out.append((c.column, _OPS[c.op], str(c.value)))
        elif isinstance(c, In) and c.values and all(_literal(v) for v in c.values):
            out.append((c.column, "IN", ",".join(str(v) for v in c.values)))
    return out


def _literal(v: Any) -> bool:
    # Strings with a comma cannot be told apart in hudi-rs's IN lists; floats may be NaN.
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, str) and "," not in v)


def _log_instant(name: str) -> str | None:
    m = _LOG.match(name)
    return m.group("instant") if m else None


def _coalesced(stream: Iterable[pa.RecordBatch], after: str | None) -> Iterator[pa.RecordBatch]:
    """hudi-rs's merged stream in batches of about ``DEFAULT_BATCH_ROWS``: it yields 1,024
    rows at a time, and each batch costs the same Python and Flight overhead whatever its size
    (profiled: that overhead made a merged read 0.8x hudi-rs alone)."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in stream:
        if after is not None:
            batch = batch.filter(pc.greater(batch.column(COMMIT_TIME), after))
        if not batch.num_rows:
            continue
        pending.append(batch)
        rows += batch.num_rows
        if rows >= DEFAULT_BATCH_ROWS:
            yield pa.concat_batches(pending)
            pending, rows = [], 0
    if pending:
        yield pa.concat_batches(pending)


def _newest_file(s: Sequence[Any], logs_named_by_commit: bool) -> str:
    """The newest instant in a slice's file names ("9..." when it cannot be known: read it).
    Log files named by their base file's instant (table versions before 8) say nothing of when
    they were written."""
    _, base, logs = s
    m = _BASE.match(base or "")
    found = [m.group("instant") if m else "9" * 20]
    found += [(_log_instant(n) if logs_named_by_commit else None) or "9" * 20 for n in logs]
    return max(found)


def _slice_files(p: _Pinned, part: str, base: str, logs: Sequence[str]) -> list[str]:
    prefix = f"{p.root}/{part}" if part else p.root
    return [f"{prefix}/{n}" for n in (base, *logs) if n]


class HudiKind(SourceKind):
    config_model = HudiConfig
    cumulative = False
    warm_imports = ("hudi",)

    def validate_state(self, name: str, state: Mapping[str, Any]) -> None:
        _instant(name, state)

    def reaches(self, source: SourceRef) -> list[Reach]:
        config: HudiConfig = self.parse_config(source)
        return locations.storage("uri", config.uri) + locations.network_options(
            "storage_options", config.storage_options, STORAGE_NETWORK
        )

    # ------------------------------------------------------------------ planning

    def _slices(self, request: ScanRequest, options: Any) -> list[ScanTask]:
        src = request.source
        instant = _instant(src.name, src.state)
        assert instant is not None
        p = _open(src, self.parse_config(src), instant)
        mapping = physical_names(request.columns, p.schema.names)
        slices = None
        filters = hudi_filters(request, mapping)
        if filters:
            try:
                slices = p.table.get_file_slices(options.with_filters(filters))
            except Exception as e:  # pruning is optional: a filter hudi-rs cannot use is not
                log.info("source %r: hudi-rs cannot prune with %s: %s", src.name, filters, e)
        if slices is None:
            try:
                slices = p.table.get_file_slices(options)
            except Exception as e:
                raise Unavailable(
                    f"source {src.name!r}: hudi-rs cannot list file slices: {e}"
                ) from e
        items = []
        for s in slices:
            # Log files written after the instant are not part of it (hudi-rs lists them; the
            # reader leaves their blocks out too, since it reads as of the instant).
            logs = [
                n
                for n in s.log_file_names
                if not p.logs_named_by_commit or (_log_instant(n) or "0") <= instant
            ]
            items.append(([s.partition_path, s.base_file_name, logs], int(s.total_size_bytes())))
        request.check_task_count(len(items))
        request.check_files(
            "data file",
            [f for (part, base, logs), _ in items for f in _slice_files(p, part, base, logs)],
        )
        config: HudiConfig = self.parse_config(src)
        groups = group_by_size(items, config.target_task_bytes)
        return [
            ScanTask(src.name, {"instant": instant, "slices": g}, exact_filter=True) for g in groups
        ]

    def plan(self, request: ScanRequest) -> list[ScanTask]:
        instant = _instant(request.source.name, request.source.state)
        if instant is None:
            return []
        return self._slices(request, _read_options(instant))

    def plan_added(self, request: ScanRequest, before: Mapping[str, Any] | None) -> list[ScanTask]:
        """The records committed after ``before``'s instant up to the pinned one: the slices at
        the pinned instant that hold a file written after it (a base file holds no record
        newer than the instant in its name), read for commit times after it. (hudi-rs 0.5's
        incremental listing takes completion times on table version 8+, not instants.)"""
        src = request.source
        until = _instant(src.name, src.state)
        since = _instant(src.name, before) if before else None
        if until is None or until == since:
            return []
        p = _open(src, self.parse_config(src), until)
        if not p.meta_fields:
            raise InvalidArgument(
                f"source {src.name!r}: the Hudi table does not populate meta fields "
                "(hoodie.populate.meta.fields=false), so it has no commit times to stream by"
            )
        after = since or "0"
        tasks = []
        for t in self.plan(request):
            fresh = [
                s for s in t.payload["slices"] if _newest_file(s, p.logs_named_by_commit) > after
            ]
            if fresh:
                tasks.append(
                    ScanTask(t.source, {**t.payload, "slices": fresh, "after": after}, True)
                )
        return tasks

    # ------------------------------------------------------------------ reading

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        src = request.source
        cols = request.columns
        instant = task.payload.get("instant")
        if not isinstance(instant, str) or not _INSTANT.match(instant):
            raise InvalidArgument(f"source {src.name!r}: ticket has no valid instant")
        p = _open(src, self.parse_config(src), instant)
        slices = [tuple(s) for s in task.payload["slices"]]
        request.check_files(
            "data file",
            [f for part, base, logs in slices for f in _slice_files(p, part, base, logs)],
        )
        after = task.payload.get("after")
        plain = [s for s in slices if not s[2] and s[1] and p.files_hold_partitions]
        merged = [s for s in slices if s not in plain]
        readers = []
        if plain:
            readers.append(self._read_base_files(request, p, plain, after))
        for part, base, logs in merged:
            readers.append(self._read_merged(request, p, instant, part, base, logs, after))
        if len(readers) == 1:
            return readers[0]
        return chain_readers(target_schema(cols), readers)

    def _read_base_files(
        self, request: ScanRequest, p: _Pinned, slices: Sequence[tuple], after: str | None
    ) -> pa.RecordBatchReader:
        """Base Parquet files without log files: whole file groups at the instant."""
        paths = [f for part, base, _ in slices for f in _slice_files(p, part, base, ())]
        fs, _ = filesystem(paths[0])
        schema = p.schema.append(pa.field(COMMIT_TIME, pa.string()))
        try:
            data = ds.dataset(
                [filesystem(f)[1] for f in paths], schema=schema, format="parquet", filesystem=fs
            )
        except (FileNotFoundError, OSError) as e:
            raise Unavailable(
                f"source {request.source.name!r}: a base file is gone (cleaned by Hudi?): {e}"
            ) from e
        if after is not None:
            data = data.filter(ds.field(COMMIT_TIME) > after)
        return scan_dataset(request, data)

    def _read_merged(
        self,
        request: ScanRequest,
        p: _Pinned,
        instant: str,
        part: str,
        base: str,
        logs: Sequence[str],
        after: str | None,
    ) -> pa.RecordBatchReader:
        """One file slice merged by hudi-rs at the instant (base file and log files)."""
        cols = request.columns
        mapping = physical_names(cols, p.schema.names)
        # Hudi's meta columns are strings on every row: leave them undecoded unless needed.
        wanted = sorted(set(mapping.values())) or p.schema.names[:1]
        options = _read_options(instant, projection=[*wanted, *([COMMIT_TIME] if after else [])])
        prefix = f"{part}/" if part else ""
        try:
            reader = p.table.create_file_group_reader_with_options(options)
            stream = reader.read_file_slice_from_paths_stream(
                f"{prefix}{base}" if base else "", [f"{prefix}{n}" for n in logs], options
            )
        except Exception as e:
            raise Unavailable(
                f"source {request.source.name!r}: hudi-rs cannot read a file slice: {e}"
            ) from e

        def batches() -> Any:
            try:
                yield from _coalesced(stream, after)
            except Exception as e:
                raise Unavailable(
                    f"source {request.source.name!r}: hudi-rs failed reading a file slice: {e}"
                ) from e

        out = conform(batches(), cols, mapping, p.schema)
        if request.predicate is not None:
            out = apply_residual(out, request.predicate)
        return out

    # ------------------------------------------------------------------ files in place

    def _base_only(self, request: ScanRequest, task: ScanTask) -> list[str] | None:
        """The task's base files when they are exactly its rows (no log files at the instant,
        partition values in the files), else None."""
        instant = task.payload.get("instant")
        if not isinstance(instant, str) or task.payload.get("after") is not None:
            return None
        p = _open(request.source, self.parse_config(request.source), instant)
        slices = [tuple(s) for s in task.payload["slices"]]
        if not p.files_hold_partitions or any(logs or not base for _, base, logs in slices):
            return None
        return [f for part, base, _ in slices for f in _slice_files(p, part, base, ())]

    def direct_files(self, request: ScanRequest, task: ScanTask) -> DirectFiles | None:
        files = self._base_only(request, task)
        if files is None:
            return None
        return DirectFiles("parquet", tuple(f.removeprefix("file://") for f in files))

    def engine_scan(self, request: ScanRequest, tasks: Sequence[ScanTask]) -> EngineScan | None:
        return parquet_engine_scan(self, request, tasks)

    def layout(self, request: ScanRequest) -> FileLayout | None:
        """The instant's base files in place, columns by name; None when a slice has log files
        (merge on read) or the files lack the partition columns."""
        src = request.source
        instant = _instant(src.name, src.state)
        if instant is None:
            return FileLayout((), {})
        paths: list[str] = []
        for task in self.plan(ScanRequest(src, request.columns, guard=request.guard)):
            files = self._base_only(request, task)
            if files is None:
                return None
            paths += files
        p = _open(src, self.parse_config(src), instant)
        laid, names = [], set()
        for path in paths:
            fs, local = filesystem(path)
            footer = parquet_footer(fs, local)
            if footer is None:
                return None
            size, rows, schema = footer
            laid.append(LaidFile(as_uri(path), size, rows))
            names.update(schema.names)
        mapping = physical_names(request.columns, p.schema.names)
        physical = {c: (n, p.schema.field(n).type) for c, n in mapping.items()}
        others = frozenset(names - set(mapping.values()))
        return FileLayout(tuple(laid), physical, other_names=others)
