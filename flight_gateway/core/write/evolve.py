"""``harness.evolve_schema``: validate, apply the additive part to every source whose kind
``EvolvesSchema``, then commit the new harness schema once.

Renames and drops stay in the harness schema (sources keep physical names, matched through
former names), so readers pinned to older versions keep their columns. If a source fails, the
error names it and the harness schema does not change; every kind's DDL is idempotent, so the
evolution can be retried.
"""

from __future__ import annotations

from typing import Any

from flight_gateway.catalog.schema import Schema, evolve
from flight_gateway.core.auth import Principal
from flight_gateway.core.context import Gateway
from flight_gateway.core.sources import bind
from flight_gateway.protocol.arrow_types import parse_type
from flight_gateway.protocol.errors import HarnessError, InvalidArgument, Unavailable
from planners.kind import Additive, EvolvesSchema


def additive_changes(old: Schema, new: Schema) -> list[Additive]:
    old_by_id = {f.id: f for f in old.fields}
    out = []
    for f in new.fields:
        before = old_by_id.get(f.id)
        if before is None:
            out.append(Additive("add", (f.name,), parse_type(f.type)))
        elif before.type != f.type:
            out.append(Additive("widen", (f.name, *f.aliases), parse_type(f.type)))
    return out


def evolve_schema(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = body.get("table")
    if not isinstance(table, str) or not table:
        raise InvalidArgument("action body needs 'table'")
    who.require("admin", table)
    cat = gw.catalog
    changes = body.get("changes") or []
    snap = cat.describe(table)
    new = evolve(snap.schema, changes, protected=[*snap.partition_by, *snap.primary_key])
    additive = additive_changes(snap.schema, new)
    for s in snap.sources if additive else ():
        kind, ref = bind(gw, snap, s.name)
        if not isinstance(kind, EvolvesSchema):
            continue  # schema on read: nothing to change in the source
        try:
            kind.apply_additive(ref, additive)
        except (HarnessError, NotImplementedError) as e:  # the caller's change, not an outage
            raise type(e)(
                f"schema change not applied to source {s.name!r} ({s.kind}): {e}; "
                "the harness schema is unchanged"
            ) from e
        except Exception as e:
            raise Unavailable(
                f"schema change not applied to source {s.name!r} ({s.kind}): {e}; "
                "the harness schema is unchanged"
            ) from e
    res = cat.evolve_schema(table, body.get("commit_id"), changes)  # type: ignore[arg-type]
    return {"version": res.version, "schema_id": res.schema_id, "applied": res.applied}
