"""``harness-gateway apply FILE.yaml``: declare tables and their sources; the gateway keeps them.

The file::

    tables:
      - name: events
        schema:
          - {name: id, type: int64}
          - {name: p, type: int32}
        partition_by: [p]          # fixed once the table exists
        primary_key: [id]          # fixed once the table exists
        properties: {dedupe.order_by: id}
        sources:
          - name: cold-0
            kind: files
            partition: {p: 0}
            config: {root: "${DATA_ROOT}/events", format: parquet}
            state: {files: []}     # the state a new source starts from

``apply`` compares each declared table with the gateway's current version and prints the plan.
It then creates missing tables and commits each table's changes as one commit (a schema change
is its own commit first, so sources with their own schema evolve with it). Re-applying an
unchanged file commits nothing. Removing a source or a column is refused unless
``--allow-destructive``; a changed config, kind or partition of an existing source is always
refused (remove it and add a new source). Errors name the line and field of the file. YAML
anchors and aliases (``&x`` / ``*x``) are refused, so a small file cannot expand to a huge one.
"""

from __future__ import annotations

import argparse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flight_gateway.cli.client_cmds import connect
from flight_gateway.cli.output import emit
from flight_gateway.errors import InvalidArgument, NotFound

_LINE = "__line__"


class _Loader(yaml.SafeLoader):
    """Records the line of every mapping, so errors can point into the file. Refuses anchors and
    aliases: a few hundred bytes of nested aliases ("billion laughs") expand to gigabytes."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if getattr(event, "anchor", None) is not None:
            what = "alias *" if isinstance(event, yaml.AliasEvent) else "anchor &"
            raise InvalidArgument(
                f"line {event.start_mark.line + 1}: YAML {what}{event.anchor} is not allowed: "
                "declaration files may not use anchors or aliases; write the values out"
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        mapping = super().construct_mapping(node, deep=True)
        mapping[_LINE] = node.start_mark.line + 1
        return mapping


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != _LINE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _fail(node: Any, where: str, message: str) -> InvalidArgument:
    line = node.get(_LINE, "?") if isinstance(node, dict) else "?"
    return InvalidArgument(f"line {line}: {where}: {message}")


def _check_keys(
    node: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...]
) -> dict[str, Any]:
    if not isinstance(node, dict):
        raise InvalidArgument(f"{where}: expected a mapping, got {type(node).__name__}")
    keys = set(node) - {_LINE}
    missing = [k for k in required if k not in keys]
    if missing:
        raise _fail(node, where, f"missing {missing}")
    unknown = sorted(keys - set(required) - set(optional))
    if unknown:
        raise _fail(node, where, f"unknown key(s) {unknown} (known: {[*required, *optional]})")
    return node


def _typed(node: dict[str, Any], key: str, where: str, kind: type | tuple[type, ...]) -> Any:
    value = node.get(key)
    if value is not None and not isinstance(value, kind):
        raise _fail(node, f"{where}.{key}", f"expected {getattr(kind, '__name__', kind)}")
    return value


@dataclass
class Declared:
    name: str
    schema: list[dict[str, Any]]
    partition_by: list[str] = field(default_factory=list)
    primary_key: list[str] = field(default_factory=list)
    properties: dict[str, Any] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)


def _source(node: Any, where: str) -> dict[str, Any]:
    node = _check_keys(node, where, ("name", "kind"), ("config", "partition", "state"))
    for key in ("config", "partition", "state"):
        _typed(node, key, where, dict)
    _typed(node, "name", where, str)
    _typed(node, "kind", where, str)
    return {
        "name": node["name"],
        "kind": node["kind"],
        "config": _strip(node.get("config") or {}),
        "partition": _strip(node.get("partition") or {}),
        "state": _strip(node.get("state") or {}),
    }


def _table(node: Any, where: str) -> Declared:
    node = _check_keys(
        node, where, ("name", "schema"), ("partition_by", "primary_key", "properties", "sources")
    )
    _typed(node, "name", where, str)
    for key in ("schema", "partition_by", "primary_key", "sources"):
        _typed(node, key, where, list)
    _typed(node, "properties", where, dict)
    schema = []
    for i, col in enumerate(node["schema"]):
        col = _check_keys(col, f"{where}.schema[{i}]", ("name", "type"), ("nullable",))
        schema.append(_strip(col))
    sources = [_source(s, f"{where}.sources[{i}]") for i, s in enumerate(node.get("sources") or [])]
    names = [s["name"] for s in sources]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise _fail(node, where, f"source(s) {dupes} declared more than once")
    return Declared(
        node["name"],
        schema,
        list(node.get("partition_by") or []),
        list(node.get("primary_key") or []),
        _strip(node.get("properties") or {}),
        sources,
    )


def load(path: str) -> list[Declared]:
    """Parse and validate a declaration file (errors name line and field)."""
    try:
        doc = yaml.load(Path(path).read_text(), Loader=_Loader)
    except OSError as e:
        raise InvalidArgument(f"cannot read {path!r}: {e}") from e
    except yaml.YAMLError as e:
        raise InvalidArgument(f"{path}: not valid YAML: {e}") from e
    doc = _check_keys(doc, "file", ("tables",), ())
    if not isinstance(doc["tables"], list):
        raise _fail(doc, "tables", "expected a list of tables")
    declared = [_table(t, f"tables[{i}]") for i, t in enumerate(doc["tables"])]
    names = [d.name for d in declared]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"{path}: a table is declared more than once: {names}")
    return declared


@dataclass
class Plan:
    table: str
    create: bool = False
    schema_changes: list[dict[str, Any]] = field(default_factory=list)
    add_sources: list[dict[str, Any]] = field(default_factory=list)
    remove_sources: list[str] = field(default_factory=list)
    properties: dict[str, Any] = field(default_factory=dict)
    destructive: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        changes = self.schema_changes, self.add_sources, self.remove_sources, self.properties
        return not self.create and not any(changes)

    def lines(self) -> list[str]:
        out = [f"+ create table {self.table}"] if self.create else []
        out += [f"~ {self.table}: schema {c}" for c in self.schema_changes]
        out += [f"+ {self.table}: source {s['name']} ({s['kind']})" for s in self.add_sources]
        out += [f"- {self.table}: source {n}" for n in self.remove_sources]
        out += [f"~ {self.table}: property {k} = {v!r}" for k, v in self.properties.items()]
        return out


def _schema_changes(current: Any, want: Declared, plan: Plan) -> None:
    have = {f.name: f for f in current.schema}
    for col in want.schema:
        f = have.get(col["name"])
        if f is None:
            plan.schema_changes.append(
                {"op": "add_column", "name": col["name"], "type": col["type"]}
            )
        elif f.type != col["type"]:
            plan.schema_changes.append(
                {"op": "widen_type", "name": col["name"], "type": col["type"]}
            )
    for name in sorted(set(have) - {c["name"] for c in want.schema}):
        plan.schema_changes.append({"op": "drop_column", "name": name})
        plan.destructive.append(f"drop column {name}")


def _source_changes(current: Any, want: Declared, plan: Plan) -> None:
    have = {s.name: s for s in current.sources}
    for s in want.sources:
        old = have.get(s["name"])
        if old is None:
            plan.add_sources.append(s)
        elif (old.kind, dict(old.partition)) != (s["kind"], s["partition"]) or not _same_config(
            old.config, s["config"]
        ):
            raise InvalidArgument(
                f"table {want.name!r}: source {s['name']!r} exists with another kind, partition "
                "or config; sources do not change: remove it and add one under a new name"
            )
    for name in sorted(set(have) - {s["name"] for s in want.sources}):
        plan.remove_sources.append(name)
        plan.destructive.append(f"remove source {name}")


def _same_config(stored: Any, declared: dict[str, Any]) -> bool:
    """Describe redacts secrets (``***``); a redacted value matches whatever is declared."""
    if isinstance(stored, dict) and isinstance(declared, dict):
        return set(stored) == set(declared) and all(
            _same_config(stored[k], declared[k]) for k in stored
        )
    return stored == declared or stored == "***"


def plan_for(client: Any, want: Declared) -> Plan:
    plan = Plan(want.name)
    try:
        current = client.describe(want.name)
    except NotFound:
        plan.create = True
        plan.add_sources = list(want.sources)
        return plan
    if list(current.partition_by) != want.partition_by:
        raise InvalidArgument(f"table {want.name!r}: partition_by cannot change")
    if list(current.primary_key) != want.primary_key:
        raise InvalidArgument(f"table {want.name!r}: primary_key cannot change")
    _schema_changes(current, want, plan)
    _source_changes(current, want, plan)
    for k, v in want.properties.items():
        if current.properties.get(k) != v:
            plan.properties[k] = v
    return plan


def _commit(client: Any, want: Declared, plan: Plan) -> list[int]:
    versions = []
    if plan.create:
        client.create_table(
            want.name,
            want.schema,
            partition_by=want.partition_by,
            primary_key=want.primary_key,
            properties=want.properties,
        )
    elif plan.schema_changes:
        versions.append(client.evolve_schema(want.name, plan.schema_changes))
    changes: dict[str, Any] = {}
    if plan.add_sources:
        changes["add_sources"] = plan.add_sources
    if plan.remove_sources:
        changes["remove_sources"] = plan.remove_sources
    if plan.properties and not plan.create:
        changes["properties"] = plan.properties
    if changes:
        summary = {"operation": "apply"}
        versions.append(
            client.commit(want.name, commit_id=uuid.uuid4().hex, summary=summary, **changes)
        )
    return versions


def apply(args: argparse.Namespace) -> int:
    declared = load(args.file)
    with connect(args) as client:
        plans = [plan_for(client, d) for d in declared]
        blocked = [f"{p.table}: {d}" for p in plans for d in p.destructive]
        if blocked and not args.allow_destructive:
            raise InvalidArgument(
                f"destructive changes refused (pass --allow-destructive): {blocked}"
            )
        lines = [line for p in plans for line in p.lines()]
        versions: dict[str, list[int]] = {}
        if not args.dry_run:
            for want, plan in zip(declared, plans, strict=True):
                if not plan.empty:
                    versions[want.name] = _commit(client, want, plan)
    result = {"plan": lines, "versions": versions}
    text = "\n".join(lines) or "no changes"
    if args.dry_run:
        text += "\n(dry run: nothing committed)"
    emit(result, args.json, text)
    return 0


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "apply", parents=[common], help="create or update tables declared in a YAML file"
    )
    p.add_argument("file")
    p.add_argument("--dry-run", action="store_true", help="print the plan, commit nothing")
    p.add_argument(
        "--allow-destructive", action="store_true", help="allow removing sources and columns"
    )
    p.set_defaults(func=apply)
