"""The ``harness.*`` actions in one table: name, what it does, the fields of its JSON body and
their types, and whether repeating it is safe (clients send those to another replica when a
gateway cannot be reached). The Flight face decodes every body through it, so an unknown field
(a typo), a missing one or one of the wrong type is INVALID_ARGUMENT naming it, whatever the
action; the core's handlers (``flight_gateway.core.actions.HANDLERS``) are keyed by the same
names. docs/protocol.md describes each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flight_gateway.protocol.errors import InvalidArgument

_STR, _INT, _NUM, _BOOL = (str,), (int,), (int, float), (bool,)
_LIST, _OBJ = (list,), (dict,)
_TIME = (str, int, float)  # RFC 3339 text or epoch seconds


@dataclass(frozen=True)
class Field:
    name: str
    types: tuple[type, ...]
    required: bool = False


def _req(name: str, types: tuple[type, ...]) -> Field:
    return Field(name, types, required=True)


def _opt(name: str, types: tuple[type, ...]) -> Field:
    return Field(name, types)


# Types as a JSON caller knows them.
_JSON_NAMES: dict[type, str] = {
    dict: "a JSON object", list: "a JSON array", str: "a string", int: "an integer",
    float: "a number", bool: "true or false",
}  # fmt: skip


@dataclass(frozen=True)
class Action:
    name: str
    doc: str
    fields: tuple[Field, ...] = ()
    #: Repeating it after a lost answer applies it at most once (or it changes nothing).
    idempotent: bool = False

    def decode(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``body`` checked against the fields: INVALID_ARGUMENT naming what is wrong."""
        known = {f.name: f for f in self.fields}
        unknown = sorted(set(body) - set(known))
        if unknown:
            raise InvalidArgument(
                f"{self.name}: unknown field(s) {unknown} (fields: {sorted(known)})"
            )
        for f in self.fields:
            value = body.get(f.name)
            if value is None:
                if f.required:
                    raise InvalidArgument(f"{self.name} needs {f.name!r}")
                continue
            bad_bool = isinstance(value, bool) and bool not in f.types
            if bad_bool or not isinstance(value, f.types):
                kinds = " or ".join(_JSON_NAMES.get(t, t.__name__) for t in f.types)
                got = _JSON_NAMES.get(type(value), type(value).__name__)
                raise InvalidArgument(f"{self.name}: {f.name} must be {kinds}, got {got}")
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
                raise InvalidArgument(f"{self.name}: {f.name} must be below 2**63 in size")
        return dict(body)


_TABLE = _req("table", _STR)
_COMMIT_ID = _req("commit_id", _STR)
_LOCK_ID = _req("lock_id", _STR)

TABLE: tuple[Action, ...] = (
    Action("harness.create_table",
           "create a table: table, schema | arrow_schema, partition_by?, primary_key?, properties?",
           (_TABLE, _opt("schema", _LIST), _opt("arrow_schema", _STR),
            _opt("partition_by", _LIST), _opt("primary_key", _LIST),
            _opt("properties", _OBJ), _opt("commit_id", _STR))),
    Action("harness.drop_table", "drop a table: table", (_TABLE,)),
    Action("harness.list_tables", "list table names", (), idempotent=True),
    Action("harness.describe", "a table at a version: table, version?, as_of?",
           (_TABLE, _opt("version", _INT), _opt("as_of", _TIME)), idempotent=True),
    Action("harness.history", "commits, newest first: table, limit?",
           (_TABLE, _opt("limit", _INT)), idempotent=True),
    Action("harness.lock", "lease a lock on sources: table, sources, owner, ttl_s, wait_s?",
           (_TABLE, _req("sources", _LIST), _opt("owner", _STR), _opt("ttl_s", _NUM),
            _opt("wait_s", _NUM))),
    Action("harness.renew_lock", "extend a lease: lock_id, ttl_s?",
           (_LOCK_ID, _opt("ttl_s", _NUM)), idempotent=True),
    Action("harness.unlock", "release a lock: lock_id", (_LOCK_ID,), idempotent=True),
    Action("harness.list_locks", "the locks of a table: table", (_TABLE,), idempotent=True),
    Action("harness.commit",
           "atomic commit: table, commit_id, lock_id?, fencing_token?, add_sources?, "
           "remove_sources?, updates?, external_state?, properties?, summary?",
           (_TABLE, _COMMIT_ID, _opt("lock_id", _STR), _opt("fencing_token", _INT),
            _opt("add_sources", _LIST), _opt("remove_sources", _LIST), _opt("updates", _LIST),
            _opt("external_state", _OBJ), _opt("properties", _OBJ),
            _opt("schema_changes", _LIST), _opt("summary", _OBJ)),
           idempotent=True),  # always carries a commit id
    Action("harness.evolve_schema", "schema change as one commit: table, commit_id, changes",
           (_TABLE, _COMMIT_ID, _req("changes", _LIST))),
    Action("harness.expire_versions", "retention: table, keep_last? | before?",
           (_TABLE, _opt("keep_last", _INT), _opt("before", _TIME))),
    Action("harness.public_key",
           "the key that verifies direct tasks -> public_key (base64url Ed25519)",
           idempotent=True),
    Action("harness.begin_write",
           "start an engine write: table, source? -> write_id, mode, location?",
           (_TABLE, _opt("source", _STR))),
    Action("harness.commit_write",
           "publish an engine write: table, write_id, source?, paths, overwrite?, relocation?, "
           "rows?, lock_id?, read_version? (a rewrite: replaces what that version held), "
           "replaces? (a bin-pack rewrite: only these of its files)",
           (_TABLE, _req("write_id", _STR), _opt("source", _STR), _req("paths", _LIST),
            _opt("overwrite", _BOOL), _opt("relocation", _BOOL), _opt("rows", _INT),
            _opt("lock_id", _STR), _opt("fencing_token", _INT), _opt("read_version", _INT),
            _opt("replaces", _LIST)),
           idempotent=True),  # keyed by its write id
    Action("harness.abort_write", "discard an engine write's files: table, write_id, source?",
           (_TABLE, _req("write_id", _STR), _opt("source", _STR))),
    Action("harness.move",
           "move rows hot -> cold in one commit: table, hot, cold, where?, mode?, staged?, "
           "wait_s? -> version, rows, applied, resumed?",
           (_TABLE, _req("hot", _STR), _req("cold", _STR), _opt("where", _STR),
            _opt("mode", _STR), _opt("staged", _OBJ), _opt("wait_s", _NUM)),
           idempotent=True),  # an interrupted move is finished by the next, never done twice
)  # fmt: skip

BY_NAME: dict[str, Action] = {a.name: a for a in TABLE}
#: name -> what it does (Flight ``ListActions``).
ACTIONS: dict[str, str] = {a.name: a.doc for a in TABLE}
IDEMPOTENT: frozenset[str] = frozenset(a.name for a in TABLE if a.idempotent)


def decode(name: str, body: Mapping[str, Any]) -> dict[str, Any]:
    action = BY_NAME.get(name)
    if action is None:
        raise NotImplementedError(f"unknown action {name[:100]!r}")
    return action.decode(body)
