"""DoAction handlers: JSON body in, JSON-able dict out (DESIGN.md §6)."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from flight_gateway.core import metrics
from flight_gateway.core.auth import Principal
from flight_gateway.core.context import Gateway
from flight_gateway.core.secrets import REF, passwords_hidden
from flight_gateway.core.sources import check_commit
from flight_gateway.core.write import locks, move, writes
from flight_gateway.core.write.evolve import evolve_schema
from flight_gateway.protocol import actions
from flight_gateway.protocol.errors import HarnessError, InvalidArgument, LockExpired
from flight_gateway.protocol.messages import parse_timestamp
from planners import registry

# Keys whose values are secrets wherever they appear in a config (``header.Authorization``,
# ``s3.secret-access-key``, ``sasl.password``, ...); ``key_column`` names a column.
_SECRET_KEY = re.compile(
    r"(password|passwd|secret|token|credential|private|auth|signature|session|key(?!_column))",
    re.I,
)


def redact(value: Any, key: str = "") -> Any:
    """Hide secrets in source configs shown by describe. A value under a secret-looking key is
    hidden whatever its type, unless it is only a ``${NAME}`` reference (which is no secret)."""
    if _SECRET_KEY.search(key) and not (isinstance(value, str) and REF.fullmatch(value)):
        return "***"
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if isinstance(value, str):
        return passwords_hidden(value)
    return value


def _table(body: Mapping[str, Any]) -> str:
    t = body.get("table")
    if not isinstance(t, str) or not t:
        raise InvalidArgument("action body needs 'table'")
    return t


def _schema_specs(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    if "arrow_schema" in body:
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(body["arrow_schema"])))
        except Exception as e:
            raise InvalidArgument(f"'arrow_schema' is not a base64 Arrow IPC schema: {e}") from e
        return [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema]
    schema = body.get("schema")
    if not isinstance(schema, list):
        raise InvalidArgument("create_table needs 'schema' (a list of fields) or 'arrow_schema'")
    return schema


def _list(body: Mapping[str, Any], key: str) -> list[Any]:
    value = body.get(key) or []
    if not isinstance(value, list):
        raise InvalidArgument(f"'{key}' must be a list")
    return value


Handler = Callable[[Gateway, Principal, dict[str, Any]], dict[str, Any]]


def create_table(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("admin", table)
    res = gw.catalog.create_table(
        table,
        _schema_specs(body),
        partition_by=body.get("partition_by") or (),
        primary_key=body.get("primary_key") or (),
        properties=body.get("properties"),
        commit_id=body.get("commit_id"),
    )
    return {"table": table, "version": res.version, "applied": res.applied}


def drop_table(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("admin", table)
    gw.catalog.drop_table(table)
    gw.source_defs.forget(table)
    return {}


def list_tables(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    return {"tables": [t for t in gw.catalog.list_tables() if who.can("read", t)]}


def describe(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("read", table)
    snap = gw.catalog.describe(
        table, version=body.get("version"), as_of=parse_timestamp(body.get("as_of"), "as_of")
    )
    out = snap.to_json()
    out["schema_id"] = snap.schema.schema_id
    out["schema"] = out["schema"]["fields"]
    for s in out["sources"]:
        s["config"] = redact(s["config"])
    return out


def history(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("read", table)
    commits = gw.catalog.history(table, limit=body.get("limit"))
    return {"versions": [c.to_json() for c in commits]}


#: Commit fields that change what a table is (not only its sources' states): admin only.
_ADMIN_FIELDS = ("add_sources", "remove_sources", "schema_changes", "properties")


def commit(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("admin" if any(body.get(k) for k in _ADMIN_FIELDS) else "write", table)
    if body.get("add_sources") or body.get("updates"):
        check_commit(gw, table, _list(body, "add_sources"), _list(body, "updates"))
    try:
        res = _commit(gw, table, body)
    except HarnessError as e:
        if isinstance(e, LockExpired):
            metrics.LOCK_EXPIRED.inc()
        metrics.COMMITS.labels(_known_table(gw, table), metrics.status_of(e)).inc()
        raise
    metrics.COMMITS.labels(table, "applied" if res.applied else "repeated").inc()
    if body.get("add_sources") or body.get("remove_sources"):
        gw.source_defs.forget(table)
    if res.applied and body.get("add_sources"):
        registry.warm(str(s["kind"]) for s in _list(body, "add_sources") if isinstance(s, Mapping))
    return {"version": res.version, "applied": res.applied, "schema_id": res.schema_id}


def _known_table(gw: Gateway, table: str) -> str:
    """The metrics label of a failed commit: its table only if the catalog has it."""
    try:
        gw.catalog.current_version(table)
    except Exception:  # NotFound, or the catalog is down: the commit's own error is reported
        return metrics.UNKNOWN_TABLE
    return table


def _commit(gw: Gateway, table: str, body: dict[str, Any]) -> Any:
    return gw.catalog.commit(
        table,
        body.get("commit_id"),  # type: ignore[arg-type]  # validated by the catalog
        lock_id=body.get("lock_id"),
        fencing_token=body.get("fencing_token"),
        add_sources=body.get("add_sources") or (),
        remove_sources=body.get("remove_sources") or (),
        updates=body.get("updates") or (),
        external_state=body.get("external_state"),
        properties=body.get("properties"),
        schema_changes=body.get("schema_changes"),
        summary=body.get("summary"),
    )


def expire_versions(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("admin", table)
    n = gw.catalog.expire_versions(
        table, keep_last=body.get("keep_last"), before=parse_timestamp(body.get("before"), "before")
    )
    return {"expired": n}


HANDLERS: dict[str, Handler] = {
    "harness.create_table": create_table,
    "harness.drop_table": drop_table,
    "harness.list_tables": list_tables,
    "harness.describe": describe,
    "harness.history": history,
    "harness.lock": locks.lock,
    "harness.renew_lock": locks.renew_lock,
    "harness.unlock": locks.unlock,
    "harness.list_locks": locks.list_locks,
    "harness.commit": commit,
    "harness.evolve_schema": evolve_schema,
    "harness.expire_versions": expire_versions,
    "harness.begin_write": writes.begin_write,
    "harness.commit_write": writes.commit_write,
    "harness.abort_write": writes.abort_write,
    "harness.move": move.move,
}
# One handler for every action of the wire's table (harness.public_key is the Flight face's).
assert set(HANDLERS) == set(actions.BY_NAME) - {"harness.public_key"}, "protocol/actions.py"
