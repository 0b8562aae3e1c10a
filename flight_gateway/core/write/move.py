"""Moves (``harness.move``): rows from a hot source to a cold one in one harness commit, so they
are visible exactly once at every version (DESIGN §4, invariant 2), whatever the kinds.

One mover over the kinds' capabilities, run in the gateway (secrets resolved here, under the
allow-list, every location checked by ``reach``):

1. pin the table; the rows to move are the hot source's at its pinned state (``where``: those
   of a filter only), read through the hot kind like any read;
2. record the move's intent in the table's ``external_state`` (its commit id and the hot state
   it moves), so a move interrupted anywhere is finished, with the same rows and commit id, by
   the next ``harness.move`` on that source before anything new moves;
3. write them into the cold source (``Appendable.append``, or ``Merges.merge`` by the table's
   primary key into a ``keyed_store``; or adopt the files an engine staged:
   ``AdoptsFiles``), idempotently by the move's commit id and marked as a relocation, which
   streaming reads skip;
4. take them out of the hot source (``Drains.drain``: Kafka's ``low`` moves up, PostgreSQL
   deletes them by key unless written since);
5. commit both new states and clear the intent in one commit (a relocation: streaming readers
   saw the rows when they were first written).

Until step 5 readers stay pinned to the old states, so nothing done so far is visible. Step 1
runs before any lock (DESIGN §18: writers do not wait while a broker or a database is read),
and so does the writing of step 3 where the cold kind can write an append's data apart from
its commit (``PreparesAppends``: Iceberg's data files); steps 2-5 hold a write lease on both
sources, after checking that no other move of the hot source committed since the rows were
read (then they are read and written again under the lease, and what was written before it is
removed). ``HARNESS_FAULT_INJECT=<step>`` makes the gateway process exit at a step (the kill
tests).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from flight_gateway.catalog import TableSnapshot
from flight_gateway.core import tracing
from flight_gateway.core.auth import Principal
from flight_gateway.core.context import Gateway
from flight_gateway.core.read.shape import resolve
from flight_gateway.core.sources import bind, guard, scan_request
from flight_gateway.core.write.ingest import discard_prepared
from flight_gateway.core.write.lease import leased
from flight_gateway.core.write.locks import seconds
from flight_gateway.core.write.writes import staging_places
from flight_gateway.protocol import operations as ops
from flight_gateway.protocol.errors import Conflict, InvalidArgument
from planners.common import filesystem
from planners.execute import execute
from planners.kind import (
    AdoptsFiles,
    Appendable,
    AppendContext,
    Drains,
    Merges,
    PreparesAppends,
    SourceKind,
)

log = logging.getLogger(__name__)
MARKER = "harness.move.{hot}"
MODES = ("auto", "append", "merge")


def checkpoint(step: str) -> None:
    """Fault injection for the kill tests: exit here, as a SIGKILL would, when asked to."""
    if os.environ.get("HARNESS_FAULT_INJECT") == step:
        log.warning("fault injection: exiting at %s", step)
        os._exit(17)


@dataclass(frozen=True)
class Move:
    """What one move takes: the hot state it moves and how, under one commit id."""

    table: str
    hot: str
    cold: str
    state: Mapping[str, Any]
    where: str | None
    mode: str
    commit_id: str
    staged: Mapping[str, Any] | None = None

    def marker(self) -> dict[str, Any]:
        return {"commit_id": self.commit_id, "cold": self.cold, "state": dict(self.state),
                "where": self.where, "mode": self.mode, "staged": self.staged}  # fmt: skip

    @classmethod
    def resumed(cls, table: str, hot: str, marker: Mapping[str, Any]) -> Move:
        return cls(table, hot, str(marker["cold"]), dict(marker["state"]), marker.get("where"),
                   str(marker.get("mode", "auto")), str(marker["commit_id"]),
                   marker.get("staged"))  # fmt: skip


def _text(body: Mapping[str, Any], key: str, required: bool = True) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"harness.move needs {key!r} (a source name)" if required
                              else f"harness.move: {key!r} must be a non-empty string")  # fmt: skip
    return value


def _new_move(
    snap: TableSnapshot, body: Mapping[str, Any], read_state: Mapping[str, Any] | None = None
) -> Move:
    """The move ``body`` asks for at ``snap``; ``read_state``: the hot source's state at the
    version the rows were read at (by an engine for a staged move, or before the lease)."""
    hot, cold = str(_text(body, "hot")), str(_text(body, "cold"))
    if hot == cold:
        raise InvalidArgument("harness.move: 'hot' and 'cold' must be two sources")
    where = _text(body, "where", required=False)
    mode = body.get("mode", "auto")
    if mode not in MODES:
        raise InvalidArgument(f"harness.move: 'mode' must be one of {list(MODES)}, not {mode!r}")
    staged = body.get("staged")
    if staged is not None and not isinstance(staged, Mapping):
        raise InvalidArgument("harness.move: 'staged' must be an object")
    # A staged move moves what the engine read: the hot state of the version it read. Writes
    # committed since stay (the drain computes the new state from the state now, and refuses
    # when the moved rows are no longer all there).
    state = dict(read_state if read_state is not None else snap.source(hot).state)
    snap.source(cold)  # NOT_FOUND now, not after the data moved
    # Unique, not derived from the state: the intent recorded before anything is written keeps
    # it for a move resumed after a crash, and kinds log writes by commit id in stores other
    # tables share (a PostgreSQL database's write log).
    commit_id = f"move:{snap.table_id}:{hot}:{cold}:{uuid.uuid4().hex}"
    return Move(snap.table, hot, cold, state, where, str(mode), commit_id, staged)


def move(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _text(body, "table")
    assert table is not None
    who.require("write", table)
    cat = gw.catalog
    snap = cat.describe(table)
    fresh = _new_move(snap, body)
    read_state = _read_state(gw, table, fresh.hot, body)
    wait_s = seconds(body.get("wait_s", 120), "wait_s")
    early = _read_early(gw, snap, fresh, body)
    ahead = _new_move(snap, body, early[1]) if early is not None else None
    prepared = _prepare_cold(gw, snap, ahead, early[2]) if ahead and early else None
    try:
        with leased(cat, table, sorted({fresh.hot, fresh.cold}), owner=f"move:{fresh.hot}",
                    ttl_s=gw.limits.write_lease_s, wait_s=wait_s) as grant:  # fmt: skip
            snap = cat.describe(table)  # fresh states under the lock
            marker = snap.external_state.get(MARKER.format(hot=fresh.hot))
            if isinstance(marker, Mapping) and marker.get("commit_id"):
                unfinished = Move.resumed(table, fresh.hot, marker)
                if unfinished.cold != fresh.cold:
                    raise Conflict(
                        f"an unfinished move of {fresh.hot!r} into {unfinished.cold!r} must be "
                        f"finished first: move {fresh.hot!r} to {unfinished.cold!r} again"
                    )
                result = _run(gw, snap, unfinished, grant.lock_id, resumed=True)
                return {**result, "resumed": True}
            staged = body.get("staged")
            if isinstance(staged, Mapping):
                _not_moved_since(cat, table, fresh.hot, int(staged["version"]))
            elif ahead and early and _still_movable(cat, table, fresh.hot, early[0]):
                return _run(gw, snap, ahead, grant.lock_id, resumed=False, rows=early[2],
                            prepared=prepared)  # fmt: skip
            return _run(gw, snap, _new_move(snap, body, read_state), grant.lock_id, resumed=False)
    finally:
        if prepared is not None:
            discard_prepared({prepared[0].source.name: prepared})


def _read_early(
    gw: Gateway, snap: TableSnapshot, fresh: Move, body: Mapping[str, Any]
) -> tuple[int, Mapping[str, Any], pa.Table] | None:
    """DESIGN §18: the rows to move, read at the pinned version before the lease is taken, so
    writers to the hot and cold sources do not wait while a broker or a database is read:
    (that version, the hot state read, the rows). None for a staged move or when an unfinished
    move must be finished first (both read under the lease)."""
    if body.get("staged") is not None:
        return None
    if isinstance(snap.external_state.get(MARKER.format(hot=fresh.hot)), Mapping):
        return None
    with tracing.span("move.read", source=fresh.hot, early=True):
        rows = _moved_rows(gw, snap, fresh)
    return snap.version, fresh.state, rows


def _still_movable(cat: Any, table: str, hot: str, version: int) -> bool:
    """The rows read at ``version`` may still be moved: no move of ``hot`` committed since
    (writes since are fine: the drain computes the new state from the state now)."""
    try:
        _not_moved_since(cat, table, hot, version)
    except Conflict:
        return False
    return True


def _not_moved_since(cat: Any, table: str, hot: str, version: int) -> None:
    """CONFLICT when another move took rows out of ``hot`` after ``version`` (an engine's
    staged copy of them would add them to the cold source a second time). Checked before
    anything is written."""
    newer = cat.describe(table).version - version
    if newer <= 0:
        return
    for commit in cat.history(table, limit=newer):
        if commit.version <= version:
            break
        summary = commit.summary or {}
        if summary.get(ops.OPERATION) == ops.MOVE and summary.get("hot") == hot:
            raise Conflict(
                f"rows of source {hot!r} were moved by version {commit.version}, after version "
                f"{version} was read: stage the move again"
            )


def _read_state(gw: Gateway, table: str, hot: str, body: Mapping[str, Any]) -> Any:
    """The hot source's state at the version an engine read for a staged move, or None."""
    staged = body.get("staged")
    if not isinstance(staged, Mapping):
        return None
    version = staged.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise InvalidArgument(
            "harness.move: 'staged.version' must be the version the rows were read at"
        )
    return gw.catalog.describe(table, version=version).source(hot).state


def _run(
    gw: Gateway,
    snap: TableSnapshot,
    m: Move,
    lock_id: str,
    resumed: bool,
    rows: pa.Table | None = None,
    prepared: tuple[AppendContext, Any] | None = None,
) -> dict[str, Any]:
    """The move ``m`` under the lease ``lock_id``; ``rows``: its rows, read before the lease,
    and ``prepared``: what the cold kind wrote of them then (``_prepare_cold``)."""
    cat = gw.catalog
    done = cat.find_commit(m.table, m.commit_id)
    if done is not None:
        return {"version": done, "rows": 0, "applied": False}
    hot_kind, _ = bind(gw, snap, m.hot, state=m.state)
    cold_kind, cold_ref = bind(gw, snap, m.cold)
    if not isinstance(hot_kind, Drains):
        raise InvalidArgument(f"source {m.hot!r} ({hot_kind.name}): rows cannot be moved out of it")
    if rows is None:
        with tracing.span("move.read", source=m.hot):
            rows = _moved_rows(gw, snap, m)
    if not rows.num_rows and not resumed:
        return {"version": None, "rows": 0, "applied": False}
    if not resumed:
        cat.commit(m.table, f"{m.commit_id}:intent", lock_id=lock_id,
                   external_state={MARKER.format(hot=m.hot): m.marker()},
                   summary={ops.OPERATION: "move-intent"})  # fmt: skip
        checkpoint("move.after_intent")
    aliases = {f.name: f.aliases for f in snap.schema.fields}
    with tracing.span("move.write", source=m.cold, rows=rows.num_rows):
        cold_state = _write_cold(gw, snap, m, cold_kind, cold_ref, rows, prepared)
    checkpoint("move.after_cold")
    hot_kind, hot_ref = bind(gw, snap, m.hot)  # its state now: writes may have come since
    ctx = AppendContext(hot_ref, m.commit_id, aliases, table=m.table,
                        guard=guard(gw, hot_ref.kind, m.table),
                        tag_key=gw.tag_key(snap.table_id, m.hot),
                        catalog_tag=cat.catalog_tag)  # fmt: skip
    assert isinstance(hot_kind, Drains)
    with tracing.span("move.drain", source=m.hot):
        hot_state = hot_kind.drain(ctx, m.state, rows, snap.primary_key, partial=bool(m.where))
    checkpoint("move.after_drain")
    res = cat.commit(
        m.table,
        m.commit_id,
        lock_id=lock_id,
        updates=[{"source": m.cold, "state": cold_state}, {"source": m.hot, "state": hot_state}],
        external_state={MARKER.format(hot=m.hot): None},
        summary=ops.relocation_summary(ops.MOVE, rows=rows.num_rows, hot=m.hot, cold=m.cold),
    )
    checkpoint("move.after_commit")
    log.info("moved %d rows %s/%s -> %s as version %d%s", rows.num_rows, m.table, m.hot,
             m.cold, res.version, " (resumed)" if resumed else "")  # fmt: skip
    return {"version": res.version, "rows": rows.num_rows, "applied": res.applied}


def _stored_columns(snap: TableSnapshot) -> list[str]:
    return [f.name for f in snap.schema.fields if f.name not in ops.READ_TIME_COLUMNS]


def _moved_rows(gw: Gateway, snap: TableSnapshot, m: Move) -> pa.Table:
    """The rows the move takes: read from the hot source at the moved state, or (an engine
    staged them) the key columns of the staged files, which ``drain`` needs."""
    if m.staged is not None:
        return _staged_keys(m, snap)
    kind, ref = bind(gw, snap, m.hot, state=m.state)
    shape = resolve(snap, _stored_columns(snap), m.where)
    request = scan_request(gw, snap.table, ref, shape.specs, shape.predicate, None)
    batches: list[pa.Table] = []
    for task in kind.plan(request):
        batches.append(execute(kind, request, task, shape.projection).read_all())
    from flight_gateway.core.read.shape import arrow_schema

    schema = arrow_schema(snap.schema, shape.projection)
    rows = pa.concat_tables(batches) if batches else schema.empty_table()
    order_by = snap.properties.get("dedupe.order_by")
    if isinstance(order_by, str) and order_by in rows.column_names:
        # A tombstone (no ordering value) is stamped while Kafka's order is still known: in
        # the cold source row order means nothing.
        from planners.dedupe import fill_order

        i = rows.column_names.index(order_by)
        rows = rows.set_column(i, rows.field(i), fill_order(rows.column(i)))
    return rows


def _staged_keys(m: Move, snap: TableSnapshot) -> pa.Table:
    import pyarrow.dataset as ds

    paths = _paths(m.staged or {})
    if not paths:
        return pa.table({})
    keys = list(snap.primary_key)
    fs, _ = filesystem(paths[0])
    dataset = ds.dataset([filesystem(p)[1] for p in paths], format="parquet", filesystem=fs)
    if not keys:
        return pa.table({"n": pa.nulls(dataset.count_rows(), pa.int8())})
    return dataset.to_table(columns=keys)


def _paths(staged: Mapping[str, Any]) -> list[str]:
    paths = staged.get("paths") or []
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise InvalidArgument("harness.move: 'staged.paths' must list the files the engine wrote")
    return list(paths)


def _write_cold(
    gw: Gateway,
    snap: TableSnapshot,
    m: Move,
    kind: SourceKind,
    ref: Any,
    rows: pa.Table,
    prepared: tuple[AppendContext, Any] | None = None,
) -> dict[str, Any]:
    if m.staged is not None:
        return _adopt(gw, kind, ref, m)
    ctx = _cold_context(gw, snap, m, ref)
    if _merges(snap, m, kind):
        if not isinstance(kind, Merges) or not snap.primary_key:
            raise InvalidArgument(f"source {m.cold!r} ({ref.kind}) cannot take rows by key")
        return kind.merge(
            ctx,
            _last_per_key(rows, snap.primary_key),
            rows.slice(0, 0).select(list(snap.primary_key)),
            snap.primary_key,
        )
    if not isinstance(kind, Appendable):
        raise InvalidArgument(f"source {m.cold!r} ({ref.kind}) cannot take rows")
    if prepared is not None:
        ctx = replace(ctx, prepared=prepared[1])
    return kind.append(ctx, rows)


def _merges(snap: TableSnapshot, m: Move, kind: SourceKind) -> bool:
    """The rows go into the cold source by the table's primary key (not appended)."""
    return m.mode == "merge" or (m.mode == "auto" and bool(snap.primary_key) and kind.keyed_store)


def _cold_context(gw: Gateway, snap: TableSnapshot, m: Move, ref: Any) -> AppendContext:
    aliases = {f.name: f.aliases for f in snap.schema.fields}
    return AppendContext(ref, m.commit_id, aliases, table=m.table,
                         guard=guard(gw, ref.kind, m.table),
                         tag_key=gw.tag_key(snap.table_id, m.cold), relocation=True,
                         catalog_tag=gw.catalog.catalog_tag)  # fmt: skip


def _prepare_cold(
    gw: Gateway, snap: TableSnapshot, m: Move, rows: pa.Table
) -> tuple[AppendContext, Any] | None:
    """DESIGN §18: the rows read before the lease written as the cold source's data before it
    too, by kinds that can (``PreparesAppends``), so that under the lease only their commit is
    left: an Iceberg move of ~10,000 rows held both sources' writers 0.3-1.4 s under the
    failover load, 0.1-0.5 s of it writing data files. The context it was written in, and
    what was written (``ingest.discard_prepared`` removes what no commit used)."""
    if m.staged is not None or not rows.num_rows:
        return None
    kind, ref = bind(gw, snap, m.cold)
    if not isinstance(kind, PreparesAppends) or _merges(snap, m, kind):
        return None
    ctx = _cold_context(gw, snap, m, ref)
    with tracing.span("move.prepare", source=m.cold, rows=rows.num_rows):
        made = kind.prepare_append(ctx, rows)
    return None if made is None else (ctx, made)


def _adopt(gw: Gateway, kind: SourceKind, ref: Any, m: Move) -> dict[str, Any]:
    staged = m.staged or {}
    if not isinstance(kind, AdoptsFiles):
        raise InvalidArgument(f"source {m.cold!r} ({ref.kind}) does not adopt staged files")
    write_id = staged.get("write_id")
    if not isinstance(write_id, str) or not write_id:
        raise InvalidArgument("harness.move: 'staged.write_id' must be the id begin_write gave")
    paths = _paths(staged)
    places = staging_places(gw, kind, ref, write_id)
    outside = [p for p in paths if not p.startswith(places) or ".." in p]
    if outside:
        raise InvalidArgument(f"files {outside[:3]} are not in this write's location")
    return kind.adopt_files(ref, paths, replace=False, commit_id=m.commit_id, relocation=True)


def _last_per_key(rows: pa.Table, key: tuple[str, ...] | list[str] | Any) -> pa.Table:
    """The last row of each key, in the order read (a later offset wins)."""
    if not rows.num_rows:
        return rows
    order = "__harness_row"
    numbered = rows.append_column(order, pa.array(range(rows.num_rows), pa.int64()))
    last = numbered.group_by(list(key), use_threads=False).aggregate([(order, "max")])
    picked = last.column(f"{order}_max")
    return rows.take(picked.take(pc.array_sort_indices(picked)))
