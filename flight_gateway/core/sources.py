"""A catalog source bound to its kind: config resolved, policies checked.

The one place where a source's ``${NAME}`` references are resolved (only allowed names) and where
what its config reaches is checked against the operator's allow-lists — for reads, DoPut, schema
changes and engine writes alike, and for configs and states before they are committed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flight_gateway.catalog import SourceSpec, SourceUpdate, TableSnapshot
from flight_gateway.core.context import Gateway
from flight_gateway.core.reach import PolicyGuard
from planners import locations
from planners.kind import DEFAULT_MAX_TASKS, ColumnSpec, ScanRequest, SourceKind, SourceRef
from planners.predicates import Expr
from planners.registry import get_kind


def _ref(
    gw: Gateway,
    table: str,
    kind: SourceKind,
    name: str,
    kind_name: str,
    config: Mapping[str, Any],
    partition: Mapping[str, Any],
    state: Mapping[str, Any],
) -> SourceRef:
    resolved = gw.secrets.resolve(config, where=f"source {name!r} config", table=table)
    ref = SourceRef(name, kind_name, resolved, partition, state)
    kind.parse_config(ref)
    gw.reach.check(name, kind_name, kind.reaches(ref), table)
    return ref


def bind(
    gw: Gateway, snap: TableSnapshot, name: str, state: Mapping[str, Any] | None = None
) -> tuple[SourceKind, SourceRef]:
    """The kind of source ``name`` at ``snap`` and the source with its config resolved (and its
    pinned state, or ``state`` when given), after the operator's policies allowed it."""
    s = snap.source(name)
    kind = get_kind(s.kind)
    pinned = s.state if state is None else state
    ref = _ref(gw, snap.table, kind, s.name, s.kind, s.config, s.partition, pinned)
    return kind, ref


def check_commit(
    gw: Gateway,
    table: str,
    add_sources: Sequence[Mapping[str, Any]],
    updates: Sequence[Mapping[str, Any]],
) -> None:
    """Reject configs and states their kind cannot read or the policies do not allow, before
    anything is committed."""
    for raw in add_sources:
        spec = SourceSpec.from_json(raw)
        kind = get_kind(spec.kind)
        kind.validate_config(spec.name, spec.config)
        kind.validate_state(spec.name, spec.state)
        gw.secrets.check(spec.config, where=f"source {spec.name!r} config", table=table)
        kind.check(
            _ref(gw, table, kind, spec.name, spec.kind, spec.config, spec.partition, spec.state)
        )
    ups = [SourceUpdate.from_json(raw) for raw in updates]
    known = gw.source_defs.get(table, [u.source for u in ups]) if ups else {}
    for up in ups:
        if up.source in known:  # an unknown source is the catalog's NOT_FOUND
            s = known[up.source]
            kind = get_kind(s.kind)
            kind.validate_state(up.source, up.state)
            kind.check(_ref(gw, table, kind, s.name, s.kind, s.config, s.partition, up.state))


def guard(gw: Gateway, kind: str, table: str) -> PolicyGuard:
    """The guard of scan requests on sources of ``kind`` of ``table``: the gateway's policy."""
    g = PolicyGuard(gw.reach, kind, table)
    locations.register_guard(g)
    return g


def scan_request(
    gw: Gateway,
    table: str,
    ref: SourceRef,
    specs: tuple[ColumnSpec, ...],
    predicate: Expr | None,
    limit: int | None,
    max_tasks: int = DEFAULT_MAX_TASKS,
) -> ScanRequest:
    """A scan request whose files are checked against the gateway's allow-lists."""
    g = guard(gw, ref.kind, table)
    return ScanRequest(ref, specs, predicate, limit, max_tasks=max_tasks, guard=g)
