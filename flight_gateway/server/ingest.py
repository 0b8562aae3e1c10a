"""DoPut: validate and route uploaded rows, append them to their sources, commit once.

Descriptor command: ``{"table", "commit_id", "source"?}``. Everything is validated and routed
before anything is written (unknown or uncastable columns, nulls in non-nullable columns, rows
that route to no source or to several: INVALID_ARGUMENT). The target sources are locked, each
kind appends idempotently by commit id (``planners.writers``), and one harness commit publishes
every new state. Repeating a commit id after a lost reply returns its version and writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from flight_gateway.arrow_types import parse_type
from flight_gateway.catalog import Catalog, SourceSnapshot, TableSnapshot
from flight_gateway.catalog.config import resolve_config
from flight_gateway.errors import InvalidArgument
from flight_gateway.server.auth import Principal
from planners.base import SourceRef
from planners.predicates import coerce

log = logging.getLogger(__name__)
LOCK_TTL_S = 300.0


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


def route(snap: TableSnapshot, data: pa.Table, source: str | None) -> dict[str, pa.Table]:
    from planners.writers import WRITABLE

    schema = data.schema
    if source is not None:
        target = snap.source(source)
        if target.kind not in WRITABLE:
            raise InvalidArgument(
                f"source {source!r} ({target.kind}) is not writable (writable kinds: {list(WRITABLE)})"
            )
        mask = _matches(target, data, schema)
        bad = data.num_rows - pc.sum(mask).as_py() if data.num_rows else 0
        if bad:
            raise InvalidArgument(
                f"{bad} row(s) do not match the partition {dict(target.partition)} of source {source!r}"
            )
        return {source: data}
    writable = [s for s in snap.sources if s.kind in WRITABLE]
    if not snap.partition_by:
        if len(writable) != 1:
            raise InvalidArgument(
                f"table {snap.table!r} has {len(writable)} writable sources and no partition_by: name a 'source'"
            )
        return {writable[0].name: data}
    masks = {s.name: _matches(s, data, schema) for s in writable if s.partition}
    counts = None
    for m in masks.values():
        as_int = pc.cast(m, pa.int8())
        counts = as_int if counts is None else pc.add(counts, as_int)
    if counts is None:
        raise InvalidArgument(f"table {snap.table!r} has no writable source with partition values")
    nowhere = pc.sum(pc.equal(counts, 0)).as_py() or 0
    ambiguous = pc.sum(pc.greater(counts, 1)).as_py() or 0
    if nowhere:
        first = (
            data.filter(pc.equal(counts, 0)).select(list(snap.partition_by)).slice(0, 1).to_pylist()
        )
        raise InvalidArgument(
            f"{nowhere} row(s) route to no writable source (e.g. {first[0]}); add a source for that partition or name one"
        )
    if ambiguous:
        raise InvalidArgument(f"{ambiguous} row(s) match several writable sources; name a 'source'")
    return {name: data.filter(m) for name, m in masks.items() if pc.any(m).as_py()}


def do_put(
    catalog: Catalog, who: Principal, command: Mapping[str, Any], data: pa.Table
) -> dict[str, Any]:
    from planners import writers

    table, commit_id, source = command.get("table"), command.get("commit_id"), command.get("source")
    if not isinstance(table, str) or not table:
        raise InvalidArgument("DoPut descriptor needs 'table'")
    if not isinstance(commit_id, str) or not commit_id:
        raise InvalidArgument("DoPut descriptor needs 'commit_id' (it makes retries safe)")
    if source is not None and not isinstance(source, str):
        raise InvalidArgument("'source' must be a source name")
    who.require("write", table)
    done = catalog.find_commit(table, commit_id)
    if done is not None:
        return {"version": done, "applied": False, "rows": 0}
    snap = catalog.describe(table)
    rows = _validate(snap, data)
    parts = route(snap, rows, source)
    if not parts:
        raise InvalidArgument("nothing to write: the upload has no rows")
    grant = catalog.lock(
        table, sorted(parts), owner=f"doput:{commit_id}", ttl_s=LOCK_TTL_S, wait_s=60
    )
    try:
        done = catalog.find_commit(table, commit_id)  # another try may have finished meanwhile
        if done is not None:
            return {"version": done, "applied": False, "rows": 0}
        snap = catalog.describe(table)  # fresh states under the lock
        aliases = {f.name: f.aliases for f in snap.schema.fields}
        updates: list[dict[str, Any]] = []
        markers: dict[str, Any] = {}
        for name, part in parts.items():
            s = snap.source(name)
            ref = SourceRef(
                s.name,
                s.kind,
                resolve_config(s.config, where=f"source {s.name!r}"),
                s.partition,
                s.state,
            )
            if s.kind == "files":
                state = writers.append_files(ref, part, commit_id)
            elif s.kind == "iceberg":
                state = writers.append_iceberg(ref, part, commit_id, aliases)
            elif s.kind == "postgres":
                state = writers.append_postgres(ref, part, commit_id, aliases)
            else:
                key = f"harness.doput.{name}"
                marker = snap.external_state.get(key) or {}
                retry = marker.get("commit_id") == commit_id
                start = int(marker["start"]) if retry else int(s.state.get("high", 0))
                if not retry:  # record where this commit starts, so a retry can look there
                    catalog.commit(
                        table,
                        f"{commit_id}:intent:{name}",
                        lock_id=grant.lock_id,
                        external_state={key: {"commit_id": commit_id, "start": start}},
                        summary={"operation": "doput-intent"},
                    )
                state = writers.append_kafka(ref, part, commit_id, start, retry=retry)
                markers[key] = None
            updates.append({"source": name, "state": state})
        res = catalog.commit(
            table,
            commit_id,
            lock_id=grant.lock_id,
            updates=updates,
            external_state=markers or None,
            summary={"operation": "doput", "rows": rows.num_rows, "sources": sorted(parts)},
        )
    finally:
        catalog.unlock(grant.lock_id)
    log.info(
        "DoPut %s into %s: %d rows -> version %d", commit_id, table, rows.num_rows, res.version
    )
    return {"version": res.version, "applied": res.applied, "rows": rows.num_rows}
