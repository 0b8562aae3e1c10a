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
refused (remove it and add a new source). Every error of the file is reported at once, as
``FILE:LINE:COLUMN: key.path: message`` (``tables.events.sources[1].kind``), before anything is
applied: column types and source kinds are checked here, not by the gateway. YAML
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
from flight_gateway.protocol.errors import InvalidArgument, NotFound

_MARKS = "__marks__"  # key -> (line, column) of its value; "" -> the mapping's own


class _Loader(yaml.SafeLoader):
    """Records where every mapping and every value starts, so errors can point into the file.
    Refuses anchors and aliases: a few hundred bytes of nested aliases ("billion laughs")
    expand to gigabytes."""

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
        marks = {"": (node.start_mark.line + 1, node.start_mark.column + 1)}
        for key_node, value_node in node.value:
            marks[str(key_node.value)] = (
                value_node.start_mark.line + 1,
                value_node.start_mark.column + 1,
            )
        mapping[_MARKS] = marks
        return mapping


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != _MARKS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


class Problems:
    """Every error of a file, each with its line, column and key path, reported together."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.found: list[tuple[int, int, str]] = []

    def add(self, node: Any, key: str | None, where: str, message: str) -> None:
        marks = node.get(_MARKS, {}) if isinstance(node, dict) else {}
        line, col = marks.get(key or "", marks.get("", (0, 0)))
        full = f"{where}.{key}" if key else where
        self.found.append((line, col, f"{self.path}:{line}:{col}: {full}: {message}"))

    def raise_any(self) -> None:
        if self.found:
            lines = [m for _, _, m in sorted(self.found)]
            raise InvalidArgument(
                f"{len(lines)} error(s) in {self.path}, nothing applied:\n" + "\n".join(lines)
            )


def _check_keys(
    node: Any,
    where: str,
    required: tuple[str, ...],
    optional: tuple[str, ...],
    problems: Problems,
) -> dict[str, Any] | None:
    if not isinstance(node, dict):
        problems.found.append((0, 0, f"{problems.path}: {where}: expected a mapping"))
        return None
    keys = set(node) - {_MARKS}
    missing = [k for k in required if k not in keys]
    if missing:
        problems.add(node, None, where, f"missing {missing}")
    for k in sorted(keys - set(required) - set(optional)):
        problems.add(node, k, where, f"unknown key (known: {[*required, *optional]})")
    return node


def _typed(
    node: dict[str, Any], key: str, where: str, kind: type | tuple[type, ...], problems: Problems
) -> bool:
    value = node.get(key)
    if value is not None and not isinstance(value, kind):
        problems.add(node, key, where, f"expected {getattr(kind, '__name__', kind)}")
        return False
    return True


@dataclass
class Declared:
    name: str
    schema: list[dict[str, Any]]
    partition_by: list[str] = field(default_factory=list)
    primary_key: list[str] = field(default_factory=list)
    properties: dict[str, Any] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)


def _source(node: Any, where: str, problems: Problems) -> dict[str, Any]:
    from planners import registry

    checked = _check_keys(node, where, ("name", "kind"), ("config", "partition", "state"), problems)
    if checked is None:
        return {}
    for key in ("config", "partition", "state"):
        _typed(checked, key, where, dict, problems)
    _typed(checked, "name", where, str, problems)
    kind = checked.get("kind")
    if _typed(checked, "kind", where, str, problems) and kind not in registry.available():
        problems.add(checked, "kind", where, f"unknown source kind {kind!r}")
    return {
        "name": checked.get("name"),
        "kind": kind,
        "config": _strip(checked.get("config") or {}),
        "partition": _strip(checked.get("partition") or {}),
        "state": _strip(checked.get("state") or {}),
    }


def _column(node: Any, where: str, problems: Problems) -> dict[str, Any]:
    """A column checked as the gateway checks it (``canonical`` types, time zones included;
    names without control characters), so that a file is refused whole, never half applied."""
    import unicodedata

    from flight_gateway.protocol.arrow_types import canonical

    col = _check_keys(node, where, ("name", "type"), ("nullable",), problems)
    if col is None:
        return {}
    name = col.get("name")
    _typed(col, "name", where, str, problems)
    if isinstance(name, str) and any(unicodedata.category(c) == "Cc" for c in name):
        problems.add(col, "name", where, "a column name holds no control character")
    _typed(col, "nullable", where, bool, problems)
    if _typed(col, "type", where, str, problems) and col.get("type") is not None:
        try:
            canonical(col["type"])
        except (InvalidArgument, ValueError, TypeError) as e:
            problems.add(col, "type", where, f"not a column type: {e}")
    out = dict(_strip(col))
    if out.get("nullable", False) is None:  # left empty in the file: the default
        del out["nullable"]
    return out


def _columns_exist(
    node: dict[str, Any], key: str, where: str, names: set[str], problems: Problems
) -> None:
    for c in node.get(key) or []:
        if c not in names:
            problems.add(node, key, where, f"{c!r} is not a column of the table")


def _table(node: Any, index: int, problems: Problems) -> Declared | None:
    optional = ("partition_by", "primary_key", "properties", "sources")
    name = node.get("name") if isinstance(node, dict) else None
    where = f"tables.{name}" if isinstance(name, str) else f"tables[{index}]"
    checked = _check_keys(node, where, ("name", "schema"), optional, problems)
    if checked is None:
        return None
    _typed(checked, "name", where, str, problems)
    ok = {k: _typed(checked, k, where, list, problems) for k in ("schema", "partition_by", "primary_key", "sources")}  # fmt: skip
    _typed(checked, "properties", where, dict, problems)
    schema_nodes = checked.get("schema") if ok["schema"] else None
    schema = [
        _column(c, f"{where}.schema[{i}]", problems) for i, c in enumerate(schema_nodes or [])
    ]
    names = {str(c["name"]) for c in schema if isinstance(c.get("name"), str)}
    for key in ("partition_by", "primary_key"):
        if ok[key]:
            _columns_exist(checked, key, where, names, problems)
    source_nodes = checked.get("sources") if ok["sources"] else None
    sources = [
        _source(x, f"{where}.sources[{i}]", problems) for i, x in enumerate(source_nodes or [])
    ]
    declared = [x.get("name") for x in sources]
    for dupe in sorted({n for n in declared if declared.count(n) > 1 and isinstance(n, str)}):
        problems.add(checked, "sources", where, f"source {dupe!r} declared more than once")
    return Declared(
        str(name),
        schema,
        list(checked.get("partition_by") or []) if ok["partition_by"] else [],
        list(checked.get("primary_key") or []) if ok["primary_key"] else [],
        _strip(checked.get("properties") or {}),
        sources,
    )


def load(path: str) -> list[Declared]:
    """Parse and validate a declaration file. Every error is reported at once, each with the
    file, line, column and key path (``tables.events.sources[2].config``); nothing is applied
    when there is one."""
    try:
        doc = yaml.load(Path(path).read_text(), Loader=_Loader)
    except OSError as e:
        raise InvalidArgument(f"cannot read {path!r}: {e}") from e
    except yaml.YAMLError as e:
        raise InvalidArgument(f"{path}: not valid YAML: {e}") from e
    problems = Problems(path)
    checked = _check_keys(doc, "file", ("tables",), (), problems)
    tables = checked.get("tables") if checked is not None else None
    if checked is not None and "tables" in checked and not isinstance(tables, list):
        problems.add(checked, "tables", "file", "expected a list of tables")
        tables = None
    declared = [_table(t, i, problems) for i, t in enumerate(tables or [])]
    names = [d.name for d in declared if d is not None]
    for dupe in sorted({n for n in names if names.count(n) > 1}):
        problems.add(checked, "tables", "file", f"table {dupe!r} declared more than once")
    problems.raise_any()
    return [d for d in declared if d is not None]


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
