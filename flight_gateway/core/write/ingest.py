"""DoPut: validate and route uploaded rows, append them to their sources, commit once.

Descriptor command: ``{"table", "commit_id", "source"?}``. Everything is validated and routed
before anything is written (unknown or uncastable columns, nulls in non-nullable columns, rows
that route to no source or to several: INVALID_ARGUMENT). Writable sources are those whose kind
is ``Appendable``. The target sources are locked, each kind appends idempotently by commit id,
and one harness commit publishes every new state. Repeating a commit id after a lost reply
returns its version and writes nothing.

What an upload may cost (docs/security.md, "DoPut"): each principal has at most
``limits.max_uploads_per_principal`` DoPuts in progress and the gateway at most
``limits.max_concurrent_uploads``; the decoded size is checked as each batch is decoded against
``limits.max_upload_bytes``; a failed allocation while decoding is RESOURCE_EXHAUSTED. pyarrow's
Flight server decodes (and decompresses) a whole batch before Python sees it, allocating what the
batch declares, so one batch is not bounded before allocation.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from flight_gateway.catalog import SourceSnapshot, TableSnapshot
from flight_gateway.catalog.commit.group import GroupCommitter
from flight_gateway.core import tracing
from flight_gateway.core.auth import Principal
from flight_gateway.core.context import Gateway
from flight_gateway.core.metrics import DOPUT_GROUP_SIZE
from flight_gateway.core.sources import bind, guard
from flight_gateway.core.write.alignment import aligned
from flight_gateway.core.write.lease import leased
from flight_gateway.core.write.merge import last_per_key, mode, with_ops
from flight_gateway.protocol import operations as ops
from flight_gateway.protocol.arrow_types import parse_type
from flight_gateway.protocol.errors import (
    Cancelled,
    InvalidArgument,
    LockExpired,
    ResourceExhausted,
)
from planners.kind import Appendable, AppendContext, AppendsMany, Merges, PreparesAppends
from planners.predicates import coerce
from planners.registry import get_kind

log = logging.getLogger(__name__)
#: Uploads written under one lease at most.
MAX_GROUP = 8


def _distinct_columns(data: pa.Table) -> None:
    twice = sorted({c for c in data.column_names if data.column_names.count(c) > 1})
    if twice:
        raise InvalidArgument(f"uploaded column(s) {twice} appear more than once")


def _validate(snap: TableSnapshot, data: pa.Table) -> pa.Table:
    fields = {f.name: f for f in snap.schema.fields}
    unknown = [c for c in data.column_names if c not in fields]
    if unknown:
        raise InvalidArgument(
            f"uploaded column(s) {unknown} are not in table {snap.table!r} (columns: {list(fields)})"
        )
    columns = []
    for f in snap.schema.fields:
        t = parse_type(f.type)
        if f.name in data.column_names:
            col = data.column(f.name)
            try:
                col = col.cast(t, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise InvalidArgument(
                    f"column {f.name!r}: cannot store {col.type} as {t}: {e}"
                ) from e
        else:
            col = pa.nulls(data.num_rows, t)
        if not f.nullable and col.null_count:
            raise InvalidArgument(
                f"column {f.name!r} is not nullable but {col.null_count} uploaded row(s) have no value"
            )
        columns.append(col)
    return pa.table(columns, names=[f.name for f in snap.schema.fields])


def _matches(source: SourceSnapshot, data: pa.Table, schema: pa.Schema) -> pa.Array:
    """Mask of rows whose partition values equal the source's."""
    mask = pa.array([True] * data.num_rows)
    for col, raw in source.partition.items():
        if col not in data.column_names:
            continue
        value = coerce(raw, schema.field(col).type, from_string=isinstance(raw, str))
        column = data.column(col)
        eq = (
            pc.is_null(column)
            if value is None
            else pc.fill_null(pc.equal(column, pa.scalar(value, column.type)), False)
        )
        mask = pc.and_(mask, eq)
    return mask


def _writable(s: SourceSnapshot) -> bool:
    return isinstance(get_kind(s.kind), Appendable)


def _route_named(snap: TableSnapshot, data: pa.Table, source: str) -> dict[str, pa.Table]:
    target = snap.source(source)
    if not _writable(target):
        raise InvalidArgument(f"source {source!r} ({target.kind}) does not accept appends")
    mask = _matches(target, data, data.schema)
    bad = data.num_rows - pc.sum(mask).as_py() if data.num_rows else 0
    if bad:
        raise InvalidArgument(
            f"{bad} row(s) do not match the partition {dict(target.partition)} of source {source!r}"
        )
    return {source: data}


def route(snap: TableSnapshot, data: pa.Table, source: str | None) -> dict[str, pa.Table]:
    """Rows per target source: the named one, the only writable one, or by partition values."""
    if source is not None:
        return _route_named(snap, data, source)
    writable = [s for s in snap.sources if _writable(s)]
    if not snap.partition_by:
        if len(writable) != 1:
            raise InvalidArgument(
                f"table {snap.table!r} has {len(writable)} writable sources and no partition_by: "
                "name a 'source'"
            )
        return {writable[0].name: data}
    masks = {s.name: _matches(s, data, data.schema) for s in writable if s.partition}
    if not masks:
        raise InvalidArgument(f"table {snap.table!r} has no writable source with partition values")
    counts = None
    for m in masks.values():
        as_int = pc.cast(m, pa.int8())
        counts = as_int if counts is None else pc.add(counts, as_int)
    nowhere = pc.sum(pc.equal(counts, 0)).as_py() or 0
    if nowhere:
        first = (
            data.filter(pc.equal(counts, 0)).select(list(snap.partition_by)).slice(0, 1).to_pylist()
        )
        raise InvalidArgument(
            f"{nowhere} row(s) route to no writable source (e.g. {first[0]}); add a source for "
            "that partition or name one"
        )
    if pc.sum(pc.greater(counts, 1)).as_py():
        raise InvalidArgument("some rows match several writable sources; name a 'source'")
    return {name: data.filter(m) for name, m in masks.items() if pc.any(m).as_py()}


def authorize(who: Principal, command: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """Check the descriptor and the caller's write permission before any data is read."""
    table, commit_id, source = _command(command)
    who.require("write", table)
    return table, commit_id, source


@contextlib.contextmanager
def memory_is_exhaustion(what: str) -> Iterator[None]:
    """A failed allocation (``pa.ArrowMemoryError`` is a ``MemoryError``) is RESOURCE_EXHAUSTED
    for the caller, never INTERNAL/UNKNOWN: the server keeps serving, nothing is committed."""
    try:
        yield
    except MemoryError as e:
        log.warning("%s: out of memory: %s", what, e)
        raise ResourceExhausted(
            f"{what}: the gateway could not allocate memory for it ({type(e).__name__}); "
            "send smaller record batches or retry later"
        ) from None


def _decoded(reader: Any) -> Iterator[pa.RecordBatch]:
    """The uploaded batches as the reader decodes them (metadata-only messages skipped), with
    misaligned buffers realigned (``alignment``)."""
    for chunk in reader:
        if chunk.data is not None:
            yield aligned(chunk.data)


def check_whole(cut: Callable[[], bool] | None) -> None:
    """CANCELLED when the upload's stream was cut (``cut``: the call's ``is_cancelled``):
    pyarrow's reader ends a stream whose client went away as if it had ended, so the rows
    read may be a part of the upload, which must not be committed."""
    if cut is not None and cut():
        raise Cancelled("the upload's stream was cut before it ended: nothing was written")


def read_upload(reader: Any, max_bytes: int) -> pa.Table:
    """The uploaded batches, refused (RESOURCE_EXHAUSTED) as soon as their decoded size exceeds
    ``max_bytes``. Each batch is checked right after pyarrow decoded it, before the next one is
    read: one batch can still cost its whole decoded size (the module's docstring)."""
    batches, total = [], 0
    with memory_is_exhaustion("DoPut upload"):
        for batch in _decoded(reader):
            total += batch.nbytes
            if total > max_bytes:
                raise ResourceExhausted(
                    f"upload is larger than {max_bytes} bytes once decoded "
                    "(limits.max_upload_bytes); split it into several DoPut calls"
                )
            batches.append(batch)
    return pa.Table.from_batches(batches, schema=reader.schema)


#: What a DoPut descriptor may carry (a misspelt ``mode`` must not append instead of merge).
_COMMAND_FIELDS = frozenset({"table", "commit_id", "source", "mode", "rows"})
#: The longest commit id the catalog keeps (checked before anything is written).
MAX_COMMIT_ID = 256


def _command(command: Mapping[str, Any]) -> tuple[str, str, str | None]:
    unknown = sorted(str(k) for k in command if k not in _COMMAND_FIELDS)
    if unknown:
        raise InvalidArgument(
            f"DoPut descriptor: unknown field(s) {unknown} (known: {sorted(_COMMAND_FIELDS)})"
        )
    table, commit_id, source = command.get("table"), command.get("commit_id"), command.get("source")
    if not isinstance(table, str) or not table:
        raise InvalidArgument("DoPut descriptor needs 'table'")
    if not isinstance(commit_id, str) or not commit_id:
        raise InvalidArgument("DoPut descriptor needs 'commit_id' (it makes retries safe)")
    if len(commit_id) > MAX_COMMIT_ID:
        raise InvalidArgument(f"DoPut 'commit_id' must be at most {MAX_COMMIT_ID} characters")
    rows = command.get("rows")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
        raise InvalidArgument("DoPut 'rows' must be the number of rows the upload sends")
    if source is not None and not isinstance(source, str):
        raise InvalidArgument("'source' must be a source name")
    return table, commit_id, source


def _intent_id(commit_id: str, source: str) -> str:
    """The commit id of an upload's intent for ``source``: ``<commit_id>:intent:<source>``,
    or a digest of it when that passes the catalog's 256 characters (a long commit id, a long
    source name); the same for every try of the upload."""
    plain = f"{commit_id}:intent:{source}"
    if len(plain) <= MAX_COMMIT_ID:
        return plain
    return "intent:" + hashlib.sha256(plain.encode()).hexdigest()


class _Appender:
    """Appends the routed parts of one upload and publishes them in one commit."""

    def __init__(
        self, gw: Gateway, table: str, commit_id: str, lock_id: str, merge: bool = False
    ) -> None:
        self.gw, self.catalog = gw, gw.catalog
        self.table, self.commit_id, self.lock_id = table, commit_id, lock_id
        self.merge = merge
        self.markers: dict[str, Any] = {}

    def _intent(self, snap: TableSnapshot, source: str) -> tuple[Any, Any]:
        """(the marker an earlier try of this commit left, a function recording a new one)."""
        key = f"harness.doput.{source}"
        marker = snap.external_state.get(key) or {}
        earlier = marker.get("intent") if marker.get("commit_id") == self.commit_id else None

        def record(intent: Mapping[str, Any]) -> None:
            self.catalog.commit(
                self.table,
                _intent_id(self.commit_id, source),
                lock_id=self.lock_id,
                external_state={key: {"commit_id": self.commit_id, "intent": dict(intent)}},
                summary={ops.OPERATION: ops.DOPUT_INTENT},
            )
            self.markers[key] = None  # cleared by the final commit

        if earlier is not None:
            self.markers[key] = None
        return earlier, record

    def append(
        self,
        snap: TableSnapshot,
        parts: Mapping[str, pa.Table],
        states: Mapping[str, Any],
        prepared: Mapping[str, Any],
        later: list[_Later] | None = None,
    ) -> list[dict[str, Any]]:
        """``states``: the sources' states the uploads before this one in its group committed
        (``snap`` was read before them); ``prepared``: what was written of each part before
        the lease (``_prepare``). Given ``later``, the parts into kinds that append a group in
        one step (``AppendsMany``) are added to it instead of written, their updates' states
        left to that step."""
        aliases = {f.name: f.aliases for f in snap.schema.fields}
        updates: list[dict[str, Any]] = []
        deferred: list[_Later] = []
        for name, part in parts.items():
            kind, ref = bind(self.gw, snap, name, states.get(name))
            assert isinstance(kind, Appendable)
            intent, record = self._intent(snap, name)
            ctx = AppendContext(
                ref,
                self.commit_id,
                aliases,
                intent,
                record,
                self.table,
                guard(self.gw, ref.kind, self.table),
                self.gw.tag_key(snap.table_id, name),
                prepared=prepared.get(name),
                catalog_tag=self.gw.catalog.catalog_tag,
            )
            if later is not None and not self.merge and isinstance(kind, AppendsMany):
                updates.append({"source": name, "state": None})
                deferred.append(_Later(name, kind, ctx, part, updates[-1]))
                continue
            with tracing.span("write", source=name, kind=ref.kind, rows=part.num_rows):
                if self.merge:
                    assert isinstance(kind, Merges)
                    upserts, deletes = last_per_key(part, snap.primary_key)
                    state = kind.merge(ctx, upserts, deletes, snap.primary_key)
                else:
                    state = kind.append(ctx, part)
            updates.append({"source": name, "state": state})
        if later is not None:  # only once every part written now was written
            later += deferred
        return updates


@dataclass(frozen=True)
class _Later:
    """An upload's part left to its kind's one step for the group (``AppendsMany``)."""

    source: str
    kind: AppendsMany
    ctx: AppendContext
    rows: pa.Table
    #: The upload's update of this source, whose state the step fills in.
    update: dict[str, Any]


@dataclass(frozen=True)
class _Upload:
    """One validated, routed DoPut waiting for its sources' lease."""

    gw: Gateway
    table: str
    commit_id: str
    parts: Mapping[str, pa.Table]
    rows: int
    merge: bool
    #: What was written of each part before the lease (``PreparesAppends``), by source.
    prepared: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Uploads of one gateway to the same sources of a table share a lease."""
        return f"{id(self.gw)}\0{self.table}\0{self.merge}\0{chr(0).join(sorted(self.parts))}"


def _not_applied(version: int) -> dict[str, Any]:
    return {"version": version, "applied": False, "rows": 0}


def _apply_group(
    first: _Upload, take: Callable[[], list[_Upload]]
) -> list[dict[str, Any] | BaseException]:
    """Uploads queued for the same sources, one after another under one lease: ``first`` takes
    the lease, then ``take`` gives every upload queued by then (``first`` first). Each still
    appends with its own commit id and gets its own version (a retry of any of them finds it),
    but the lock is taken, the table read, and their versions committed once for all of them
    (``_Pending``). Under load most of a lease's hold was that read, the lock's hand-over and
    one catalog commit after another, not the writing (DESIGN §18)."""
    gw, table, catalog = first.gw, first.table, first.gw.catalog
    with leased(
        catalog,
        table,
        sorted(first.parts),
        owner=f"doput:{first.commit_id}",
        ttl_s=gw.limits.write_lease_s,
        wait_s=60,
    ) as grant:
        uploads = take()
        DOPUT_GROUP_SIZE.observe(len(uploads))
        with tracing.span("recheck", table=table, uploads=len(uploads)):
            # Another try of a commit may have finished meanwhile; states fresh under the lock.
            latest, done = gw.snapshots.latest_unless_done(table, [u.commit_id for u in uploads])
        pending = _Pending(gw, table)
        outcomes: list[dict[str, Any] | BaseException] = []
        twins: dict[int, int] = {}  # a second try of a commit id in this group -> the first's
        slots: dict[str, int] = {}
        for upload in uploads:
            if upload.commit_id in done:
                outcomes.append(_not_applied(done[upload.commit_id]))
                continue
            if upload.commit_id in slots:
                twins[len(outcomes)] = slots[upload.commit_id]
                outcomes.append(_not_applied(0))  # the first's outcome, below
                continue
            assert latest is not None  # read unless every upload of the group was done
            slots[upload.commit_id] = len(outcomes)
            try:
                pending.append(upload, latest, grant.lock_id, len(outcomes))
            except LockExpired as e:  # the lease is gone: nothing more is written under it
                outcomes.append(e)
                pending.fail(outcomes, e)
                outcomes += [e] * (len(uploads) - len(outcomes))
                break
            except Exception as e:  # this upload's own failure; the others go on
                outcomes.append(e)
                continue
            outcomes.append(_not_applied(0))  # replaced by its commit's outcome
            # An intent marker, or a kind that commits each upload alone: commit now. If that
            # failed, the next uploads would write on top of states no version published.
            failed = pending.commit(outcomes) if pending.marked else None
            if failed is not None:
                outcomes += [failed] * (len(uploads) - len(outcomes))
                break
        pending.commit(outcomes)
    for twin, first_slot in twins.items():
        got = outcomes[first_slot]
        outcomes[twin] = got if isinstance(got, BaseException) else _not_applied(got["version"])
    return outcomes


class _Pending:
    """Uploads of a group written under its lease whose versions are not committed yet: they
    commit together, in order, in one catalog transaction (``Catalog.commit_all``), each as its
    own version. Each upload's append starts from the states the ones before it wrote, so a
    failed transaction fails them all (retries find what was written by commit id), and a
    failed append takes no part. An upload that recorded an intent (Kafka) commits before the
    next one appends: the next intent would replace its marker; so does one into a kind
    without ``group_appends``."""

    def __init__(self, gw: Gateway, table: str) -> None:
        self.gw, self.table = gw, table
        self.states: dict[str, Any] = {}
        self.commits: list[tuple[int, _Upload, dict[str, Any]]] = []  # (outcome slot, ...)
        self.later: list[_Later] = []  # parts written in one step per source before the commit
        self.marked = False

    def append(self, upload: _Upload, snap: TableSnapshot, lock_id: str, slot: int) -> None:
        appender = _Appender(self.gw, self.table, upload.commit_id, lock_id, upload.merge)
        updates = appender.append(snap, upload.parts, self.states, upload.prepared, self.later)
        summary = {
            ops.OPERATION: ops.DOPUT,
            "rows": upload.rows,
            "sources": sorted(upload.parts),
            **({"merge": True} if upload.merge else {}),
        }
        commit = {"commit_id": upload.commit_id, "lock_id": lock_id, "updates": updates,
                  "external_state": appender.markers or None, "summary": summary}  # fmt: skip
        self.commits.append((slot, upload, commit))
        alone = not all(get_kind(snap.source(n).kind).group_appends for n in upload.parts)
        self.marked = bool(appender.markers) or alone
        for u in updates:
            if u["state"] is not None:  # else written later, in one step (``_write_later``)
                self.states[u["source"]] = u["state"]

    def commit(self, outcomes: list[dict[str, Any] | BaseException]) -> BaseException | None:
        """Commit what is pending, each outcome in its slot; the first failure, if any."""
        if not self.commits:
            return None
        failed: BaseException | None = None
        with tracing.span("commit", table=self.table, uploads=len(self.commits)):
            try:
                self._write_later()
                commits = [c for _, _, c in self.commits]
                results = self.gw.catalog.commit_all(self.table, commits)
            except Exception as e:  # the catalog's transaction failed: none applied
                results = [e] * len(self.commits)
        for (slot, upload, _), res in zip(self.commits, results, strict=True):
            if isinstance(res, BaseException):
                outcomes[slot] = res
                failed = failed or res
                continue
            log.info("DoPut %s into %s: %d rows -> version %d", upload.commit_id, self.table,
                     upload.rows, res.version)  # fmt: skip
            outcomes[slot] = {"version": res.version, "applied": res.applied, "rows": upload.rows}
        self.commits, self.later, self.marked = [], [], False
        return failed

    def _write_later(self) -> None:
        """Each source's deferred parts in one step of its kind (``AppendsMany``); if one
        fails, every pending upload does (they all write the group's sources)."""
        by_source: dict[str, list[_Later]] = {}
        for part in self.later:
            by_source.setdefault(part.source, []).append(part)
        self.later = []
        for name, parts in by_source.items():
            rows = sum(p.rows.num_rows for p in parts)
            kind_name = parts[0].ctx.source.kind
            with tracing.span("write", source=name, kind=kind_name, rows=rows, uploads=len(parts)):
                states = parts[0].kind.append_many([p.ctx for p in parts], [p.rows for p in parts])
            for part, state in zip(parts, states, strict=True):
                part.update["state"] = state
            self.states[name] = states[-1]

    def fail(self, outcomes: list[dict[str, Any] | BaseException], e: BaseException) -> None:
        """Nothing pending commits (the lease is gone): each fails with ``e``."""
        for slot, _, _ in self.commits:
            outcomes[slot] = e
        self.commits, self.later, self.marked = [], [], False


#: Uploads of this gateway queued per ``_Upload.key``: the first of a key leads, waits for
#: the sources' lease and only then takes every upload queued by then (``_apply_group``), so
#: uploads that arrive while it waits behind a move or a compaction's commit join that lease.
_GROUPS: GroupCommitter[_Upload, dict[str, Any]] = GroupCommitter(
    None, MAX_GROUP, late_apply=lambda _key, first, take: _apply_group(first, take)
)


def do_put(
    gw: Gateway,
    who: Principal,
    command: Mapping[str, Any],
    data: pa.Table,
    cut: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Validate, route, write and commit one upload. ``cut``: whether the upload's stream was
    cut (``check_whole``), asked again just before the commit."""
    table, commit_id, source = authorize(who, command)
    declared = command.get("rows")
    if declared is not None and declared != data.num_rows:
        # A client that closed its stream early without an error (its own code failed while
        # writing) sends a normal end: only the count it declared tells.
        raise InvalidArgument(
            f"the upload sent {data.num_rows} rows but its descriptor declares {declared}: "
            "nothing was written"
        )
    with tracing.span("describe", table=table):
        latest, done = gw.snapshots.latest_unless_done(table, [commit_id])
    if latest is None:
        return _not_applied(done[commit_id])
    snap = latest
    merge = mode(command) == "merge"
    with tracing.span("validate", table=table, rows=data.num_rows):
        _distinct_columns(data)  # before ``with_ops`` takes its ``_op`` column by name
        rows = with_ops(snap, data, _validate) if merge else _validate(snap, data)
        if not rows.num_rows:  # a version with nothing in it, and a file of no rows
            raise InvalidArgument("nothing to write: the upload has no rows")
        parts = route(snap, rows, source)
    if not parts:
        raise InvalidArgument("nothing to write: the upload has no rows")
    if merge:
        for name in parts:
            s = snap.source(name)
            if not isinstance(get_kind(s.kind), Merges):
                raise InvalidArgument(f"source {name!r} ({s.kind}) does not take upserts/deletes")
    prepared = {} if merge else _prepare(gw, snap, table, commit_id, parts)
    upload = _Upload(
        gw, table, commit_id, parts, rows.num_rows, merge, {n: p for n, (_, p) in prepared.items()}
    )
    try:
        check_whole(cut)
        outcome = _GROUPS.submit(upload.key, upload)
    finally:
        # What no commit used: this DoPut failed, or a retry found its rows.
        discard_prepared(prepared)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _prepare(
    gw: Gateway, snap: TableSnapshot, table: str, commit_id: str, parts: Mapping[str, pa.Table]
) -> dict[str, tuple[AppendContext, Any]]:
    """Each part's data written before the lease by kinds that can (``PreparesAppends``), with
    the context it was written in: the lease then covers the commits only."""
    aliases = {f.name: f.aliases for f in snap.schema.fields}
    done: dict[str, tuple[AppendContext, Any]] = {}
    try:
        for name, part in parts.items():
            kind, ref = bind(gw, snap, name)
            if not isinstance(kind, PreparesAppends):
                continue
            ctx = AppendContext(
                ref,
                commit_id,
                aliases,
                table=table,
                guard=guard(gw, ref.kind, table),
                catalog_tag=gw.catalog.catalog_tag,
            )
            with tracing.span("prepare", source=name, kind=ref.kind, rows=part.num_rows):
                made = kind.prepare_append(ctx, part)
            if made is not None:
                done[name] = (ctx, made)
    except BaseException:
        discard_prepared(done)
        raise
    return done


def discard_prepared(prepared: Mapping[str, tuple[AppendContext, Any]]) -> None:
    """What each source's kind prepared (``PreparesAppends``) and no commit used, removed."""
    for name, (ctx, made) in prepared.items():
        kind = get_kind(ctx.source.kind)
        try:
            assert isinstance(kind, PreparesAppends)
            kind.discard_prepared(ctx, made)
        except Exception:  # only space is lost: the files were never committed
            log.warning("could not remove what was prepared for source %r", name, exc_info=True)
