"""DoAction handlers: JSON body in, JSON-able dict out (DESIGN.md §6)."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from flight_gateway.arrow_types import parse_type
from flight_gateway.catalog import Catalog
from flight_gateway.catalog.config import resolve_config
from flight_gateway.errors import InvalidArgument
from flight_gateway.protocol.messages import parse_timestamp
from flight_gateway.server.auth import Principal

_SECRET_KEY = re.compile(r"(password|passwd|secret|token|credential|private)", re.I)
_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)([^@/\s]+)(@)")
_DSN_PASSWORD = re.compile(r"(password\s*=\s*)(\S+)", re.I)


def redact(value: Any, key: str = "") -> Any:
    """Hide secrets in source configs shown by describe (``${ENV}`` references stay visible)."""
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if isinstance(value, str):
        if _SECRET_KEY.search(key) and not value.startswith("${"):
            return "***"
        return _DSN_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***\3", value))
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


Handler = Callable[[Catalog, Principal, dict[str, Any]], dict[str, Any]]


def create_table(cat: Catalog, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("write", table)
    res = cat.create_table(
        table,
        _schema_specs(body),
        partition_by=body.get("partition_by") or (),
        primary_key=body.get("primary_key") or (),
        properties=body.get("properties"),
    )
    return {"table": table, "version": res.version}


def drop_table(cat: Catalog, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("write", table)
    cat.drop_table(table)
    return {}


def list_tables(cat: Catalog, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    return {"tables": [t for t in cat.list_tables() if who.can("read", t)]}


def describe(cat: Catalog, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("read", table)
    snap = cat.describe(
        table, version=body.get("version"), as_of=parse_timestamp(body.get("as_of"), "as_of")
    )
    out = snap.to_json()
    out["schema_id"] = snap.schema.schema_id
    out["schema"] = out["schema"]["fields"]
    for s in out["sources"]:
        s["config"] = redact(s["config"])
    return out


def history(cat: Catalog, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("read", table)
    return {"versions": [c.to_json() for c in cat.history(table, limit=body.get("limit"))]}


def lock(cat: Catalog, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("write", table)
    g = cat.lock(
        table,
        body.get("sources") or [],
        owner=str(body.get("owner") or who.name),
        ttl_s=body.get("ttl_s", 60),
        wait_s=body.get("wait_s", 0) or 0,
    )
    return {
        "lock_id": g.lock_id,
        "fencing_token": g.fencing_token,
        "expires_at": g.expires_at,
        "sources": list(g.sources),
    }


def renew_lock(cat: Catalog, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    return {"expires_at": cat.renew_lock(str(body.get("lock_id", "")), body.get("ttl_s"))}


def unlock(cat: Catalog, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    cat.unlock(str(body.get("lock_id", "")))
    return {}


def commit(cat: Catalog, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("write", table)
    res = cat.commit(
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
    return {"version": res.version, "applied": res.applied, "schema_id": res.schema_id}


def evolve_schema(cat: Catalog, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    """Validate, apply the additive part to every source with a schema, then commit once."""
    from flight_gateway.catalog.schema import evolve
    from flight_gateway.errors import HarnessError, Unavailable
    from planners.base import SourceRef
    from planners.ddl import Additive, apply_additive

    table = _table(body)
    who.require("write", table)
    changes = body.get("changes") or []
    snap = cat.describe(table)
    new = evolve(snap.schema, changes, protected=[*snap.partition_by, *snap.primary_key])
    old_by_id = {f.id: f for f in snap.schema.fields}
    additive = []
    for f in new.fields:
        old = old_by_id.get(f.id)
        if old is None:
            additive.append(Additive("add", (f.name,), parse_type(f.type)))
        elif old.type != f.type:
            additive.append(Additive("widen", (f.name, *f.aliases), parse_type(f.type)))
    for s in snap.sources:
        ref = SourceRef(
            s.name,
            s.kind,
            resolve_config(s.config, where=f"source {s.name!r}"),
            s.partition,
            s.state,
        )
        try:
            apply_additive(ref, additive)
        except HarnessError as e:
            raise type(e)(
                f"schema change not applied to source {s.name!r} ({s.kind}): {e}; the harness schema is unchanged"
            ) from e
        except Exception as e:
            raise Unavailable(
                f"schema change not applied to source {s.name!r} ({s.kind}): {e}; the harness schema is unchanged"
            ) from e
    res = cat.evolve_schema(table, body.get("commit_id"), changes)  # type: ignore[arg-type]
    return {"version": res.version, "schema_id": res.schema_id, "applied": res.applied}


def expire_versions(cat: Catalog, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("write", table)
    n = cat.expire_versions(
        table, keep_last=body.get("keep_last"), before=parse_timestamp(body.get("before"), "before")
    )
    return {"expired": n}


HANDLERS: dict[str, Handler] = {
    "harness.create_table": create_table,
    "harness.drop_table": drop_table,
    "harness.list_tables": list_tables,
    "harness.describe": describe,
    "harness.history": history,
    "harness.lock": lock,
    "harness.renew_lock": renew_lock,
    "harness.unlock": unlock,
    "harness.commit": commit,
    "harness.evolve_schema": evolve_schema,
    "harness.expire_versions": expire_versions,
}
