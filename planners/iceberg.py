"""``iceberg`` sources: one pyiceberg table read at the pinned ``snapshot_id``.

Config: ``catalog`` (pyiceberg catalog properties, e.g. ``{"type": "sql", "uri": ...,
"warehouse": ...}``), optional ``catalog_name``, and ``identifier`` (``"db.table"``).
State: ``{"snapshot_id": int | null}`` (null: the table had no snapshot, so no rows).
Planning runs pyiceberg's ``plan_files`` with the row filter and groups data files into tasks;
reading runs ``ArrowScan`` over the task's files (position deletes applied by pyiceberg) and
applies equality deletes by data sequence number (``planners.iceberg_mor``: each delete file
decoded once per process, one anti-join per group of data files sharing delete files).

Writes: DoPut appends one snapshot tagged with the commit id (a retry reuses it); engines write
Parquet files that are registered with one ``add_files`` (overwrite and compaction delete the
old files in the same transaction). Schema changes: ``update_schema().union_by_name``.
Streaming: the data files of the snapshots appended between two states, relocations excluded.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from flight_gateway.protocol import operations as ops
from flight_gateway.protocol.errors import InvalidArgument, NotFound, Unavailable
from planners import locations
from planners.common import (
    conform,
    empty_reader,
    fit_to_schema,
    group_by_size,
    physical_names,
    pushdown,
    to_physical,
)
from planners.iceberg_manifests import entries as manifest_entries
from planners.iceberg_mor import Planned, deleted_positions, read_task
from planners.iceberg_mor import plan as plan_with_deletes
from planners.iceberg_plain import plain_read
from planners.kind import (
    ALLOW_ALL,
    Additive,
    AppendContext,
    DirectFiles,
    EngineScan,
    Guard,
    Pinned,
    Reach,
    ScanRequest,
    ScanTask,
    SourceConfig,
    SourceKind,
    SourceRef,
    parquet_engine_scan,
)
from planners.layout import POSITION_DELETES, FileLayout, LaidFile
from planners.predicates import nan_safe
from planners.predicates.iceberg import to_iceberg

log = logging.getLogger(__name__)
_catalogs: dict[str, Any] = {}
_plans: OrderedDict[str, tuple[Any, dict[str, str], Planned]] = OrderedDict()
_tables: OrderedDict[str, tuple[Any, Any]] = OrderedDict()  # (table, snapshot) per snapshot
_planned: OrderedDict[str, Planned] = OrderedDict()  # per snapshot and pushed-down filter
_lock = threading.Lock()
T = TypeVar("T")


def _recall(cache: OrderedDict[str, T], key: str) -> T | None:
    with _lock:
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
        return hit


def _remember(cache: OrderedDict[str, T], key: str, bound: int, make: Callable[[], T]) -> T:
    """``cache[key]``, made by ``make`` (outside the lock) when missing; ``bound`` kept."""
    hit = _recall(cache, key)
    if hit is not None:
        return hit
    value = make()
    with _lock:
        value = cache.setdefault(key, value)
        cache.move_to_end(key)
        while len(cache) > bound:
            cache.popitem(last=False)
    return value


def _pinned_table(request: ScanRequest) -> tuple[Any, Any]:
    """The request's Iceberg table (loaded now) and its pinned snapshot."""
    src = request.source
    snap_id = _snapshot_id(src.name, src.state)
    table = load_table(src.config, request.guard)
    snapshot = table.snapshot_by_id(snap_id)
    if snapshot is None:
        raise NotFound(f"source {src.name!r}: Iceberg snapshot {snap_id} does not exist (expired?)")
    return table, snapshot


@dataclass(frozen=True, kw_only=True)
class IcebergConfig(SourceConfig):
    #: pyiceberg catalog properties (``type``, ``uri``, ``warehouse``, ...)
    catalog: dict[str, Any]
    identifier: str
    catalog_name: str = "default"

    def __post_init__(self) -> None:
        # pyiceberg imports the classes these name: a table writer must not load code.
        loading = sorted(k for k in self.catalog if str(k).startswith(("py-", "harness.")))
        if loading:
            raise InvalidArgument(
                f"iceberg catalog properties {loading} load code or are the gateway's own; "
                "not allowed"
            )


#: Catalog types whose every location the gateway can check (others reach services it cannot
#: see, such as AWS Glue through boto's own configuration).
CATALOG_TYPES = ("sql", "rest", "hive", "in-memory")
#: Network-like catalog properties and how each is checked; any other is refused.
CATALOG_NETWORK = {
    "oauth2-server-uri": "uri",
    "s3.endpoint": "uri",
    "s3.proxy-uri": "uri",
}


def catalog_type(props: Mapping[str, Any]) -> str:
    """The type pyiceberg infers when ``type`` is missing (from the ``uri`` scheme)."""
    if props.get("type"):
        return str(props["type"]).lower()
    uri = str(props.get("uri", ""))
    if uri.startswith(("http://", "https://")):
        return "rest"
    if uri.startswith("thrift://"):
        return "hive"
    return "sql" if uri else "rest"


def _catalog_reaches(props: Mapping[str, Any]) -> list[Reach]:
    """The catalog database or service, the warehouse and storage endpoints, as pyiceberg and
    its drivers will use them; network settings the gateway cannot check are refused."""
    kind = catalog_type(props)
    if kind not in CATALOG_TYPES:
        raise InvalidArgument(
            f"iceberg catalog type {kind!r} is not supported (use one of {list(CATALOG_TYPES)})"
        )
    out: list[Reach] = []
    uri = props.get("uri")
    if uri:
        if kind == "sql":
            out += sql_url_reaches("catalog.uri", str(uri))
        elif kind == "hive":
            out.append(locations.host("catalog.uri", str(uri), 9083))
        else:
            out.append(locations.service_uri("catalog.uri", str(uri)))
    if props.get("warehouse") and kind != "rest":  # a REST warehouse is a name, not a place
        out += locations.storage("catalog.warehouse", str(props["warehouse"]))
    rest = {k: v for k, v in props.items() if k not in ("uri", "warehouse")}
    return out + locations.network_options("catalog", rest, CATALOG_NETWORK)


def sql_url_reaches(key: str, url: str) -> list[Reach]:
    """A SQLAlchemy URL: a SQLite file, or the hosts (query ``host``/``hostaddr`` included) of a
    server database."""
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url)
    except Exception as e:
        raise InvalidArgument(f"config {key!r} is not a database URL") from e
    if u.get_backend_name() == "sqlite":
        db = u.database or ""
        return [] if db in ("", ":memory:") else [Reach("path", key, locations.local_real(db))]
    params = {k: str(v) for k, v in u.query.items() if isinstance(v, str)}
    if u.host:
        params.setdefault("host", u.host)
    if u.port:
        params.setdefault("port", str(u.port))
    if u.get_backend_name() == "postgresql":
        from psycopg.conninfo import make_conninfo

        from planners.postgres import dsn_reaches

        return dsn_reaches(make_conninfo(**params), key)
    if not u.host:
        raise InvalidArgument(f"config {key!r} names no host")
    return [Reach("host", key, locations.host_port(u.host, u.port))]


def load_table(config: Mapping[str, Any], guard: Guard = ALLOW_ALL) -> Any:
    """The pyiceberg table of a (resolved) source config; catalogs are opened once. With a
    gateway's guard every file pyiceberg opens is checked first (``planners.iceberg_io``)."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError, RESTError

    from planners import iceberg_io, iceberg_tx

    cfg = IcebergConfig.parse(config, where="iceberg source")
    props = {k: str(v) for k, v in cfg.catalog.items()}
    if guard.key:
        locations.register_guard(guard)
        props |= {"py-io-impl": iceberg_io.IO_IMPL, iceberg_io.GUARD_PROPERTY: guard.key}
    key = json.dumps([cfg.catalog_name, props], sort_keys=True, default=str)
    with _lock:
        cat = _catalogs.get(key)
        if cat is None:
            try:
                cat = load_catalog(cfg.catalog_name, **props)
            except Exception as e:
                raise Unavailable(f"cannot open Iceberg catalog: {e}") from e
            iceberg_tx.share_metadata(cat)
            _catalogs[key] = cat
    try:
        table = cat.load_table(cfg.identifier)
    except NoSuchTableError as e:
        raise NotFound(f"Iceberg table {cfg.identifier!r} does not exist") from e
    except (RESTError, OSError) as e:  # the catalog's server failed or refused, not the caller
        raise Unavailable(
            f"Iceberg catalog of table {cfg.identifier!r}: {type(e).__name__}: {e}"
        ) from e
    if guard.key:
        _check_table_io(table, guard)
    return table


def _check_table_io(table: Any, guard: Guard) -> None:
    """A table's own properties join its FileIO's: they may not replace the guarded IO or point
    storage at endpoints the gateway does not allow."""
    from planners import iceberg_io

    if not isinstance(table.io, iceberg_io.GuardedFileIO):
        raise InvalidArgument(
            "the Iceberg table's properties choose their own file IO; not allowed"
        )
    own = {k: v for k, v in table.properties.items() if locations.looks_like_network(k)}
    guard.check(None, locations.network_options("table property", own, CATALOG_NETWORK))


def _snapshot_id(source: str, state: Mapping[str, Any]) -> int | None:
    snap = state.get("snapshot_id")
    if snap is not None and (isinstance(snap, bool) or not isinstance(snap, int)):
        raise InvalidArgument(f"source {source!r}: snapshot_id must be an integer, got {snap!r}")
    return snap


def _floating(schema: Any) -> set[str]:
    """The float and double columns of a pyiceberg schema."""
    from pyiceberg.types import DoubleType, FloatType

    return {f.name for f in schema.fields if isinstance(f.field_type, (FloatType, DoubleType))}


def task_files(tasks: Sequence[Any], planned: Planned | None = None) -> list[str]:
    """Data, position delete and equality delete files of pyiceberg ``FileScanTask``s."""
    out = [t.file.file_path for t in tasks] + [d.file_path for t in tasks for d in t.delete_files]
    if planned is not None:
        out += [d.file_path for t in tasks for d in planned.deletes_for(t.file.file_path)]
    return list(dict.fromkeys(out))


def lineage_after(
    table: Any, since: int | None, until: int | None = None
) -> tuple[list[Any], bool]:
    """Snapshots after ``since`` on the lineage ending at ``until`` (default: the current
    snapshot), oldest first, and whether ``since`` was on that lineage (when it is not, every
    ancestor is returned)."""
    from pyiceberg.table.snapshots import ancestors_of

    end = table.current_snapshot() if until is None else table.snapshot_by_id(int(until))
    if end is None:
        if until is not None:
            raise NotFound(f"Iceberg snapshot {until} does not exist (expired?)")
        return [], since is None
    out: list[Any] = []
    for snap in ancestors_of(end, table.metadata):
        if snap.snapshot_id == since:
            return list(reversed(out)), True
        out.append(snap)
    return list(reversed(out)), since is None


def snapshot_properties(snap: Any) -> dict[str, str]:
    return dict(snap.summary.additional_properties) if snap.summary is not None else {}


def _after_state(table: Any, ctx: AppendContext) -> Any | None:
    """Before a DoPut's write under the source's lock: the snapshot an earlier try of its
    commit made (a retry reuses it), else None, once the table is back at the published state
    when only abandoned writes of the same harness table lie beyond it (``_drop_abandoned``)."""
    src = ctx.source
    state_id = _snapshot_id(src.name, src.state)
    since, on_lineage = lineage_after(table, state_id)
    for i, snap in enumerate(since):
        if snapshot_properties(snap).get(ops.SNAP_COMMIT_ID) != ctx.commit_id:
            continue
        # A group's uploads append one after another before their versions commit together
        # (ingest._Pending): if that commit failed, this snapshot holds the rows of the group's
        # earlier uploads too. Reusing it would publish them, and their retries would write
        # them again; so every abandoned DoPut goes, and this one writes afresh.
        others = [s for s in since[:i] if _doput_of(s, ctx.table)]
        dropped = bool(others and on_lineage and ctx.table) and _drop_abandoned(
            table, src.name, state_id, since, str(ctx.table)
        )
        return None if dropped else snap
    if since and on_lineage and ctx.table:
        _drop_abandoned(table, src.name, state_id, since, ctx.table)
    return None


def _doput_of(snap: Any, harness_table: str | None) -> bool:
    """Whether ``snap`` is a DoPut of ``harness_table`` (not a move's or compaction's)."""
    props = snapshot_properties(snap)
    return props.get(ops.SNAP_TABLE) == harness_table and not ops.snapshot_is_relocation(props)


def _drop_abandoned(
    table: Any, name: str, state_id: int | None, since: Sequence[Any], harness_table: str
) -> bool:
    """Move the table's main branch back to ``state_id`` when every snapshot after it is a
    DoPut of ``harness_table`` that no commit published (under the source's lock, a later one
    cannot be in flight): its gateway died between its Iceberg commit and the catalog's.
    Writing on top would publish its rows with this write, and its client's retry (same commit
    id, after the lock's lease ran out) would not find its snapshot past the new state and
    write them again: rows read twice (the failover chaos bench, 1 run in ~10). Moves and
    compactions (relocations), other harness tables' writes and writers outside the harness
    are left as they are, written on top as before. True when the branch was moved back."""
    from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
    from pyiceberg.table.update import AssertRefSnapshotId, RemoveSnapshotRefUpdate

    from planners.iceberg_tx import transaction

    if not all(_doput_of(snap, harness_table) for snap in since):
        return False
    current = since[-1].snapshot_id
    log.warning("iceberg source %r: snapshots %s were written by harness commits that never "
                "landed: the table goes back to snapshot %s", name,
                [s.snapshot_id for s in since], state_id)  # fmt: skip
    with transaction(table) as tx:
        if state_id is None:  # nothing was ever published: no snapshot is current
            # pyiceberg's own calls (mypy sees only the models' hyphenated aliases)
            removed = RemoveSnapshotRefUpdate(ref_name=MAIN_BRANCH)  # type: ignore[call-arg]
            still = AssertRefSnapshotId(snapshot_id=current, ref=MAIN_BRANCH)  # type: ignore[call-arg]
            tx._stage((removed,), (still,))
        else:
            tx._stage(*tx._set_ref_snapshot(state_id, MAIN_BRANCH, SnapshotRefType.BRANCH))
    return True


def added_data_files(table: Any, snap: Any) -> list[str]:
    """Paths of the data files ``snap`` itself added."""
    return [
        e.data_file.file_path
        for m in snap.manifests(table.io)
        for e in manifest_entries(table.io, m)
        if e.snapshot_id == snap.snapshot_id
    ]


class IcebergKind(SourceKind):
    group_appends = True  # abandoned group snapshots are dropped, never reused
    config_model = IcebergConfig
    cumulative = False
    #: What ``load_table`` and a scan's plan import (``SourceKind.warm``).
    warm_imports = (
        "pyiceberg.catalog.sql",
        "pyiceberg.io.pyarrow",
        "pyiceberg.avro.file",
        "pyiceberg.avro.decoder_fast",
        "pyiceberg.manifest",
        "pyiceberg.table",
        "planners.iceberg_io",
        "planners.iceberg_tx",
    )

    def validate_state(self, name: str, state: Mapping[str, Any]) -> None:
        _snapshot_id(name, state)

    def reaches(self, source: SourceRef) -> list[Reach]:
        return _catalog_reaches(self.parse_config(source).catalog)

    # ------------------------------------------------------------------ reading

    def _scan(self, request: ScanRequest) -> tuple[Any, dict[str, str], Planned]:
        """(scan, name mapping, planned FileScanTasks with their equality deletes), cached per
        pinned request: a snapshot never changes, so DoGet calls reuse the plan without
        reloading table metadata. The loaded table is shared by every request of the
        snapshot, the planned files by those with the same filter (planning does not depend
        on the columns selected): statements reading other columns of a pinned snapshot
        neither reload its metadata nor re-read its manifest list."""
        src = request.source
        snap_id = _snapshot_id(src.name, src.state)
        at = [src.config.get("catalog"), src.config.get("identifier"), snap_id]
        at.append(request.guard.key)  # the scan's file IO checks files with this guard
        columns = [(c.name, c.aliases) for c in request.columns]
        key = json.dumps([at, columns, repr(request.predicate)], sort_keys=True, default=str)
        hit = _recall(_plans, key)
        if hit is not None:
            return hit
        table_key = json.dumps(at, sort_keys=True, default=str)
        table, snapshot = _remember(_tables, table_key, 16, lambda: _pinned_table(request))
        schema = table.schemas().get(snapshot.schema_id, table.schema())
        mapping = physical_names(request.columns, [f.name for f in schema.fields])
        pred = pushdown(request, mapping)
        if pred is not None:
            # Iceberg bounds leave NaN out; the gateway applies the exact predicate after.
            pred, _ = nan_safe(pred, _floating(schema))
        # With no requested column in this table, still read one so row counts (and deletes)
        # are right; conform then yields nulls for every requested column.
        selected = tuple(sorted(set(mapping.values()))) or (schema.fields[0].name,)
        scan = table.scan(
            row_filter=to_iceberg(pred), selected_fields=selected, snapshot_id=snap_id
        )
        planned = _remember(
            _planned, json.dumps([table_key, repr(pred)]), 32, lambda: plan_with_deletes(scan)
        )
        keys = {schema.find_field(i).name for i in planned.key_field_ids()} - set(selected)
        if keys:  # equality deletes match on key columns the read must then carry too
            selected = tuple(sorted({*selected, *keys}))
            scan = table.scan(
                row_filter=to_iceberg(pred), selected_fields=selected, snapshot_id=snap_id
            )
        # A plan holds the table metadata and every file task.
        return _remember(_plans, key, 32, lambda: (scan, mapping, planned))

    def _tasks(self, request: ScanRequest, files: list[tuple[str, int]]) -> list[ScanTask]:
        groups = group_by_size(files, self.parse_config(request.source).target_task_bytes)
        # The gateway re-applies the exact predicate: Iceberg's filter only prunes.
        return [ScanTask(request.source.name, {"files": g}) for g in groups]

    def plan(self, request: ScanRequest) -> list[ScanTask]:
        if _snapshot_id(request.source.name, request.source.state) is None:
            return []
        _, _, planned = self._scan(request)
        tasks = planned.tasks
        request.check_files("data file", task_files(tasks, planned))
        return self._tasks(
            request, [(t.file.file_path, int(t.file.file_size_in_bytes)) for t in tasks]
        )

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        cols = request.columns
        if _snapshot_id(request.source.name, request.source.state) is None:
            return empty_reader(cols)
        scan, mapping, planned = self._scan(request)
        wanted = set(task.payload["files"])
        mine = [t for t in planned.tasks if t.file.file_path in wanted]
        if len(mine) != len(wanted):
            raise NotFound(
                f"source {request.source.name!r}: ticket names data files not in snapshot"
            )
        request.check_files("data file", task_files(mine, planned))  # before the stream starts
        plain = plain_read(request, scan, _read_schema(scan), mapping, planned, mine)
        if plain is not None:
            return plain
        return conform(read_task(scan, planned, mine), cols, mapping)

    def engine_scan(self, request: ScanRequest, tasks: Sequence[ScanTask]) -> EngineScan | None:
        return parquet_engine_scan(self, request, tasks)

    def direct_files(self, request: ScanRequest, task: ScanTask) -> DirectFiles | None:
        if _snapshot_id(request.source.name, request.source.state) is None:
            return None
        scan, mapping, planned = self._scan(request)
        wanted = set(task.payload["files"])
        mine = [t for t in planned.tasks if t.file.file_path in wanted]
        deletes = any(t.delete_files or planned.deletes_for(t.file.file_path) for t in mine)
        if len(mine) != len(wanted) or deletes:
            return None  # deletes must be applied: the gateway reads this task
        if any("PARQUET" not in str(t.file.file_format).upper() for t in mine):
            return None  # ORC/Avro data files: read through the gateway
        # Field ids of the pinned snapshot's schema: data files written under older schemas
        # carry the same ids under whatever names they had then.
        schema = _read_schema(scan)
        ids = {
            c.name: schema.find_field(mapping[c.name]).field_id
            for c in request.columns
            if c.name in mapping
        }
        return DirectFiles("parquet", tuple(t.file.file_path for t in mine), ids)

    def layout(self, request: ScanRequest) -> FileLayout | None:
        """Data and position delete files where they are, columns by field id; equality
        deletes resolved once to the positions they delete (readers such as pyiceberg apply
        position deletes only). None for ORC/Avro files and nested columns."""
        if _snapshot_id(request.source.name, request.source.state) is None:
            return FileLayout((), {})
        scan, mapping, planned = self._scan(request)
        return iceberg_layout(scan, _read_schema(scan), mapping, planned, request)

    def plan_added(self, request: ScanRequest, before: Mapping[str, Any] | None) -> list[ScanTask]:
        """Data files added by the append snapshots between the two states (the tasks are read
        at ``request``'s snapshot, which holds them). Snapshots that relocate rows (movers,
        compaction) add none."""
        src = request.source
        until = _snapshot_id(src.name, src.state)
        since = _snapshot_id(src.name, before) if before else None
        if until is None or until == since:
            return []
        table = load_table(src.config, request.guard)
        files: set[str] = set()
        for snap in lineage_after(table, since, until)[0]:
            if not ops.snapshot_is_relocation(snapshot_properties(snap)):
                files.update(added_data_files(table, snap))
        _, _, planned = self._scan(request)
        sizes = [(t.file.file_path, int(t.file.file_size_in_bytes)) for t in planned.tasks]
        return self._tasks(request, [(p, n) for p, n in sizes if p in files]) if files else []

    # ------------------------------------------------------------------ writing

    def append(self, ctx: AppendContext, rows: pa.Table) -> dict[str, Any]:
        src = ctx.source
        table = load_table(src.config, ctx.guard)
        # An earlier try of this commit may have appended already: reuse that snapshot.
        earlier = _after_state(table, ctx)
        if earlier is not None:
            return {**src.state, "snapshot_id": earlier.snapshot_id}
        from planners import iceberg_tx

        props = ops.write_properties(ctx.commit_id, ctx.relocation, ctx.table)
        prepared = ctx.prepared
        if isinstance(prepared, iceberg_tx.PreparedFiles) and iceberg_tx.fits(table, prepared):
            iceberg_tx.append_files(table, prepared, props)  # the files were written already
        else:  # not prepared, or the schema or partitioning changed since
            data = fit_to_schema(rows, table.schema().as_arrow(), ctx.aliases)
            iceberg_tx.append(table, data, props)
        return {**src.state, "snapshot_id": table.current_snapshot().snapshot_id}

    def append_many(
        self, ctxs: Sequence[AppendContext], rows: Sequence[pa.Table]
    ) -> list[dict[str, Any]]:
        """A DoPut group's uploads as one Iceberg transaction of one snapshot each
        (``AppendsMany``). When one of them was tried before (a retry: its snapshot may lie
        past the published state), they are appended one by one instead, as ``append`` finds
        and reuses what was written."""
        from planners import iceberg_tx

        first = ctxs[0]
        src = first.source
        table = load_table(src.config, first.guard)
        state_id = _snapshot_id(src.name, src.state)
        since, on_lineage = lineage_after(table, state_id)
        tried = {snapshot_properties(s).get(ops.SNAP_COMMIT_ID) for s in since}
        if len(ctxs) == 1 or any(c.commit_id in tried for c in ctxs):
            return self._append_each(ctxs, rows)
        if since and on_lineage and first.table:
            _drop_abandoned(table, src.name, state_id, since, first.table)
        batches = []
        for ctx, part in zip(ctxs, rows, strict=True):
            prepared = ctx.prepared
            if not (
                isinstance(prepared, iceberg_tx.PreparedFiles) and iceberg_tx.fits(table, prepared)
            ):
                data = fit_to_schema(part, table.schema().as_arrow(), ctx.aliases)
                prepared = iceberg_tx.write_data_files(table, data)
            batches.append(
                (prepared, ops.write_properties(ctx.commit_id, ctx.relocation, ctx.table))
            )
        ids = iceberg_tx.append_many(table, batches)
        return [{**src.state, "snapshot_id": i} for i in ids]

    def _append_each(
        self, ctxs: Sequence[AppendContext], rows: Sequence[pa.Table]
    ) -> list[dict[str, Any]]:
        states, state = [], ctxs[0].source.state
        for ctx, part in zip(ctxs, rows, strict=True):
            source = dataclasses.replace(ctx.source, state=state)
            state = self.append(dataclasses.replace(ctx, source=source), part)
            states.append(state)
        return states

    def prepare_append(self, ctx: AppendContext, rows: pa.Table) -> Any:
        """The rows written as the table's data files before the lease: under it, an append
        only commits them (under 16 writers and 64 readers on 2 cores an Iceberg DoPut held
        its lease seconds, while other writers of the source queued behind it)."""
        from planners import iceberg_tx

        if not rows.num_rows:
            return None
        table = load_table(ctx.source.config, ctx.guard)
        data = fit_to_schema(rows, table.schema().as_arrow(), ctx.aliases)
        return iceberg_tx.write_data_files(table, data)

    def discard_prepared(self, ctx: AppendContext, prepared: Any) -> None:
        from planners import iceberg_tx

        if isinstance(prepared, iceberg_tx.PreparedFiles) and not prepared.used:
            iceberg_tx.delete_files(load_table(ctx.source.config, ctx.guard), prepared)

    def merge(
        self, ctx: AppendContext, upserts: pa.Table, deletes: pa.Table, key: Sequence[str]
    ) -> dict[str, Any]:
        """One snapshot: the upserted rows as data files, and one equality delete file with
        every key touched (upserted or deleted), which hides their older rows only: an
        equality delete applies to lower data sequence numbers (``planners.iceberg_deletes``)."""
        from planners.iceberg_deletes import write_changes

        src = ctx.source
        table = load_table(src.config, ctx.guard)
        earlier = _after_state(table, ctx)
        if earlier is not None:
            return {**src.state, "snapshot_id": earlier.snapshot_id}  # a retry
        schema = table.schema()
        touched = pa.concat_tables([upserts.select(list(key)), deletes.select(list(key))])
        touched = to_physical(touched, [f.name for f in schema.fields], ctx.aliases)
        data = fit_to_schema(upserts, schema.as_arrow(), ctx.aliases) if upserts.num_rows else None
        sid = write_changes(
            table,
            data=data,
            deletes=touched,
            equality_ids=[schema.find_field(n).field_id for n in touched.column_names],
            snapshot_properties=ops.write_properties(ctx.commit_id, ctx.relocation, ctx.table),
        )
        return {**src.state, "snapshot_id": sid}

    def staging_location(self, source: SourceRef, write_id: str) -> str:
        return f"{load_table(source.config).location().rstrip('/')}/data/spark-{write_id}"

    def adopt_files(
        self,
        source: SourceRef,
        files: Sequence[str],
        *,
        replace: bool,
        commit_id: str,
        relocation: bool,
    ) -> dict[str, Any]:
        from pyiceberg.expressions import AlwaysTrue

        from planners.iceberg_tx import transaction

        table = load_table(source.config)
        for snap in lineage_after(table, _snapshot_id(source.name, source.state))[0]:
            if snapshot_properties(snap).get(ops.SNAP_COMMIT_ID) == commit_id:
                return {**source.state, "snapshot_id": snap.snapshot_id}  # a retry
        props = {ops.SNAP_COMMIT_ID: commit_id}
        if relocation:
            props[ops.SNAP_RELOCATION] = "true"
        with transaction(table) as tx:
            if replace:
                tx.delete(AlwaysTrue(), snapshot_properties=props)
            if files:
                try:
                    tx.add_files(list(files), snapshot_properties=props)
                except ValueError as e:  # the files do not fit the table (types, names)
                    raise InvalidArgument(f"source {source.name!r}: cannot adopt files: {e}") from e
        table.refresh()
        snap = table.current_snapshot()
        return {**source.state, "snapshot_id": snap.snapshot_id if snap else None}

    def rewrite_files(
        self,
        source: SourceRef,
        replaced: Mapping[str, Any],
        files: Sequence[str],
        *,
        commit_id: str,
        only: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        from planners.iceberg_rewrite import rewrite

        table = load_table(source.config)
        then = _snapshot_id(source.name, replaced)
        for snap in lineage_after(table, then)[0]:
            if snapshot_properties(snap).get(ops.SNAP_COMMIT_ID) == commit_id:
                return {**source.state, "snapshot_id": snap.snapshot_id}  # a retry
        sid = rewrite(table, source.name, then, files, commit_id, lineage_after, only)
        return {**source.state, "snapshot_id": sid}

    def maintain(self, pinned: Sequence[Pinned], grace_s: float) -> dict[str, Any]:
        """Snapshot expiry below the oldest pin of each Iceberg table the harness reads.
        (Orphan data files are left: pyiceberg 0.12 has no safe orphan removal.)"""
        expired = {}
        for config, snaps in _pins(pinned).values():
            n = expire_below_pins(config, snaps)
            if n:
                expired[str(config.get("identifier"))] = n
        return {"expired": expired}

    def apply_additive(self, source: SourceRef, changes: Sequence[Additive]) -> None:
        table = load_table(source.config)
        names = {f.name for f in table.schema().fields}
        fields = []
        for c in changes:
            phys = next((n for n in c.names if n in names), None)
            if c.op == "add" and phys is None:
                fields.append(pa.field(c.names[0], c.type, nullable=True))
            elif c.op == "widen" and phys is not None:
                fields.append(pa.field(phys, c.type, nullable=True))
        if fields:
            # union_by_name adds missing columns and promotes types (int -> long, float ->
            # double, decimal precision up), as Iceberg's evolution rules allow.
            with table.update_schema() as update:
                update.union_by_name(pa.schema(fields))


# ---------------------------------------------------------------------------- maintenance


def _pins(pinned: Sequence[Pinned]) -> dict[str, tuple[Mapping[str, Any], set[int]]]:
    """Iceberg table (catalog + identifier) -> (a config to load it, snapshot ids pinned)."""
    out: dict[str, tuple[Mapping[str, Any], set[int]]] = {}
    for p in pinned:
        snap = _snapshot_id(p.source.name, p.source.state)
        key = json.dumps(
            [p.source.config.get("catalog"), p.source.config.get("identifier")],
            sort_keys=True,
            default=str,
        )
        entry = out.setdefault(key, (p.source.config, set()))
        if snap is not None:
            entry[1].add(snap)
    return out


#: Tries of an expiry that lost the table to a writer's commit (an append, a mover).
EXPIRE_TRIES = 5


def expire_below_pins(config: Mapping[str, Any], pinned: set[int]) -> int:
    """Expire (metadata only, as pyiceberg does) the snapshots older than the oldest pinned
    one; snapshots after it stay, so ``since`` reads between pins walk an unbroken lineage.
    Branch and tag heads are protected by pyiceberg. Optimistic (DESIGN §18): a writer that
    committed meanwhile makes the catalog refuse the expiry; it reads the table again and
    tries again, and after ``EXPIRE_TRIES`` leaves it to the next maintenance pass."""
    from pyiceberg.exceptions import CommitFailedException

    for attempt in range(EXPIRE_TRIES):
        table = load_table(config)
        stamps = {s.snapshot_id: s.timestamp_ms for s in table.metadata.snapshots}
        oldest = min((stamps[i] for i in pinned if i in stamps), default=None)
        if oldest is None:
            return 0
        current = table.current_snapshot()
        doomed = [
            i
            for i, ts in stamps.items()
            if ts < oldest and i not in pinned and (current is None or i != current.snapshot_id)
        ]
        if not doomed:
            return 0
        # ``older_than`` the oldest pin names the same snapshots (pinned ones are not older;
        # branch and tag heads, the current one among them, are protected). ``by_ids`` copied
        # the whole table metadata twice per snapshot named: 0.1-0.3 s of a core per pass
        # under bench_chaos's writers, hundreds of snapshots each time (py-spy).
        since = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
        until = since + datetime.timedelta(milliseconds=oldest)
        try:
            table.maintenance.expire_snapshots().older_than(until).commit()
        except CommitFailedException:
            time.sleep(0.05 * (attempt + 1))
            continue
        return len(doomed)
    log.info("iceberg %s: snapshot expiry lost %d times to writers; left to the next pass",
             config.get("identifier"), EXPIRE_TRIES)  # fmt: skip
    return 0


def _read_schema(scan: Any) -> Any:
    """The pinned snapshot's schema (field ids and names as they were then)."""
    meta = scan.table_metadata
    snap = meta.snapshot_by_id(scan.snapshot_id) if scan.snapshot_id else None
    schema = meta.schema_by_id(snap.schema_id) if snap and snap.schema_id is not None else None
    return schema or meta.schema()


def _stats(f: Any) -> dict[str, dict[int, Any]]:
    names = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts",
             "lower_bounds", "upper_bounds")  # fmt: skip
    return {n: dict(getattr(f, n) or {}) for n in names}


def iceberg_layout(
    scan: Any, schema: Any, mapping: Mapping[str, str], planned: Planned, request: ScanRequest
) -> FileLayout | None:
    """The files of a planned Iceberg scan (``IcebergKind.layout``)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.types import PrimitiveType

    fields = {
        c.name: schema.find_field(mapping[c.name]) for c in request.columns if c.name in mapping
    }
    if any(not isinstance(f.field_type, PrimitiveType) for f in fields.values()):
        return None  # nested ids would have to be mapped too: made a slice of instead
    physical = {
        c: (f.name, schema_to_pyarrow(f.field_type, include_field_ids=False))
        for c, f in fields.items()
    }
    request.check_files("data file", task_files(planned.tasks, planned))
    data, deletes, positions = [], {}, []
    for t in planned.tasks:
        f = t.file
        if "PARQUET" not in str(f.file_format).upper():
            return None
        # Paths exactly as the table's metadata has them: position delete files name data
        # files by that string.
        data.append(LaidFile(f.file_path, int(f.file_size_in_bytes),
                             int(f.record_count), stats=_stats(f)))  # fmt: skip
        for d in t.delete_files:
            if "PARQUET" not in str(d.file_format).upper():
                return None
            deletes[d.file_path] = LaidFile(d.file_path, int(d.file_size_in_bytes),
                                            int(d.record_count), POSITION_DELETES)  # fmt: skip
        equality = planned.deletes_for(f.file_path)
        if equality:
            pos = deleted_positions(scan.io, schema, f, equality)
            if len(pos):
                positions.append(pa.table({
                    "file_path": pa.array([f.file_path] * len(pos), pa.string()),
                    "pos": pos,
                }))  # fmt: skip
    file_ids = frozenset(int(i) for s in scan.table_metadata.schemas for i in _all_ids(s))
    return FileLayout(
        (*data, *deletes.values()),
        physical,
        {c: int(f.field_id) for c, f in fields.items()},
        file_ids,
        pa.concat_tables(positions) if positions else None,
    )


def _all_ids(schema: Any) -> list[int]:
    from pyiceberg.schema import index_by_id

    return list(index_by_id(schema))
