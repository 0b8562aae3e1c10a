"""Harness schemas: ordered fields with stable ids, and the evolution operations.

A schema version is immutable. Evolution produces a new ``Schema`` whose fields keep their ids,
so readers match renamed columns by id and sources lacking a field yield nulls for it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from flight_gateway.protocol.arrow_types import canonical, is_safe_widening
from flight_gateway.protocol.errors import InvalidArgument, NotFound


@dataclass(frozen=True)
class Field:
    id: int
    name: str
    type: str  # canonical Arrow type string
    nullable: bool = True
    #: Former names, newest first: schema-on-read sources (files, Kafka JSON) written before a
    #: rename still carry the old name.
    aliases: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "type": self.type,
            "nullable": self.nullable,
        }
        if self.aliases:
            d["aliases"] = list(self.aliases)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Field:
        return cls(
            int(d["id"]),
            str(d["name"]),
            str(d["type"]),
            bool(d.get("nullable", True)),
            tuple(d.get("aliases", ())),
        )


@dataclass(frozen=True)
class Schema:
    schema_id: int
    fields: tuple[Field, ...]

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    @property
    def last_field_id(self) -> int:
        return max((f.id for f in self.fields), default=0)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise NotFound(f"column {name!r} not in schema {self.schema_id}")

    def to_json(self) -> dict[str, Any]:
        return {"schema_id": self.schema_id, "fields": [f.to_json() for f in self.fields]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Schema:
        return cls(int(d["schema_id"]), tuple(Field.from_json(f) for f in d["fields"]))


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name or name != name.strip():
        raise InvalidArgument(f"{what} must be a non-empty name without outer spaces, got {name!r}")
    if any(unicodedata.category(c) == "Cc" for c in name):  # NUL: no SQL engine reads it back
        raise InvalidArgument(f"{what} must not hold control characters, got {name!r}")
    return name


#: What a field of a new table's schema may say ("id" and "aliases", as ``describe`` shows
#: them, are ignored: ids are given here, a new table has no former names); anything else
#: is a typo that would have been ignored.
_FIELD_KEYS = frozenset({"name", "type", "nullable", "id", "aliases"})


def new_schema(specs: Iterable[Mapping[str, Any]]) -> Schema:
    """Build schema 0 from ``[{"name", "type", "nullable"?}]``, assigning ids 1..n."""
    fields: list[Field] = []
    seen: set[str] = set()
    for i, spec in enumerate(specs, start=1):
        if not isinstance(spec, Mapping):
            raise InvalidArgument(f"schema field #{i} must be an object, got {spec!r}")
        name = _check_name(spec.get("name"), f"schema field #{i} name")
        if name in seen:
            raise InvalidArgument(f"duplicate column name {name!r} in schema")
        seen.add(name)
        if "type" not in spec:
            raise InvalidArgument(f"schema field {name!r} has no type")
        unknown = sorted(str(k) for k in spec if k not in _FIELD_KEYS)
        if unknown:
            raise InvalidArgument(f"schema field {name!r}: unknown key(s) {unknown}")
        nullable = spec.get("nullable", True)
        if not isinstance(nullable, bool):
            raise InvalidArgument(f"schema field {name!r}: 'nullable' must be true or false")
        fields.append(Field(i, name, canonical(spec["type"]), nullable))
    if not fields:
        raise InvalidArgument("a table schema needs at least one column")
    return Schema(0, tuple(fields))


#: What each schema change may say.
_CHANGE_KEYS: dict[str, frozenset[str]] = {
    "add_column": frozenset({"op", "name", "type", "nullable"}),
    "rename_column": frozenset({"op", "name", "field_id", "new_name"}),
    "drop_column": frozenset({"op", "name", "field_id"}),
    "widen_type": frozenset({"op", "name", "field_id", "type"}),
    "make_nullable": frozenset({"op", "name", "field_id"}),
}


def evolve(
    schema: Schema,
    changes: Sequence[Mapping[str, Any]],
    *,
    protected: Iterable[str] = (),
    last_field_id: int | None = None,
) -> Schema:
    """Apply evolution ``changes`` to ``schema`` and return the next schema version.

    ``protected`` names columns that may not be dropped (partition and primary-key columns).
    ``last_field_id`` is the highest id ever used by the table, so a dropped column's id is never
    reused for a new one (that would make old data appear under the new column).
    """
    if not changes:
        raise InvalidArgument("schema evolution needs at least one change")
    fields = list(schema.fields)
    next_id = max(last_field_id or 0, schema.last_field_id) + 1
    protected_names = set(protected)

    def find(change: Mapping[str, Any], op: str) -> int:
        key = change.get("field_id")
        if key is not None and (isinstance(key, bool) or not isinstance(key, int)):
            raise InvalidArgument(f"{op}: field_id must be an integer, got {key!r}")
        for i, f in enumerate(fields):
            if (key is not None and f.id == key) or (key is None and f.name == change.get("name")):
                return i
        target = f"field id {key}" if key is not None else f"column {change.get('name')!r}"
        raise InvalidArgument(f"{op}: {target} does not exist in the schema")

    for change in changes:
        if not isinstance(change, Mapping):
            raise InvalidArgument(f"schema change must be an object, got {change!r}")
        op = change.get("op")
        unknown = sorted(str(k) for k in change if k not in _CHANGE_KEYS.get(str(op), change))
        if unknown:  # a misspelt field_id would have matched the column by name instead
            raise InvalidArgument(f"{op}: unknown key(s) {unknown}")
        if op == "add_column":
            name = _check_name(change.get("name"), "add_column name")
            if any(f.name == name for f in fields):
                raise InvalidArgument(f"add_column: column {name!r} already exists")
            if "type" not in change:
                raise InvalidArgument(f"add_column: column {name!r} needs a type")
            if change.get("nullable", True) is False:
                # Rows written before this version have no value for the column.
                raise InvalidArgument(f"add_column: new column {name!r} must be nullable")
            fields.append(Field(next_id, name, canonical(change["type"]), True))
            next_id += 1
        elif op == "rename_column":
            i = find(change, op)
            new_name = _check_name(change.get("new_name"), "rename_column new_name")
            if any(f.name == new_name for f in fields):
                raise InvalidArgument(f"rename_column: column {new_name!r} already exists")
            if fields[i].name in protected_names:
                raise InvalidArgument(
                    f"rename_column: {fields[i].name!r} is a partition or primary-key column"
                )
            old = fields[i]
            aliases = tuple(a for a in (old.name, *old.aliases) if a != new_name)
            fields[i] = replace(old, name=new_name, aliases=aliases)
        elif op == "drop_column":
            i = find(change, op)
            if fields[i].name in protected_names:
                raise InvalidArgument(
                    f"drop_column: {fields[i].name!r} is a partition or primary-key column"
                )
            if len(fields) == 1:
                raise InvalidArgument("drop_column: cannot drop the last column")
            del fields[i]
        elif op == "widen_type":
            i = find(change, op)
            if "type" not in change:
                raise InvalidArgument("widen_type needs a type")
            new_type = canonical(change["type"])
            if not is_safe_widening(fields[i].type, new_type):
                raise InvalidArgument(
                    f"widen_type: {fields[i].type} -> {new_type} for column {fields[i].name!r} "
                    "is not a safe widening"
                )
            fields[i] = replace(fields[i], type=new_type)
        elif op == "make_nullable":
            i = find(change, op)
            fields[i] = replace(fields[i], nullable=True)
        else:
            raise InvalidArgument(
                f"unknown schema change op {op!r} (expected add_column, rename_column, "
                "drop_column, widen_type or make_nullable)"
            )
    return Schema(schema.schema_id + 1, tuple(fields))
