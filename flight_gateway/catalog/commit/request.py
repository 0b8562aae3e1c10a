"""A commit as the catalog applies it: validated and normalised before it queues, so the
appliers (``portable``, ``postgres``) only check it against the table and write it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flight_gateway.catalog.model import SourceSpec, SourceUpdate
from flight_gateway.catalog.validation import as_list, check_source_name, to_json
from flight_gateway.protocol.errors import InvalidArgument


@dataclass(frozen=True)
class CommitRequest:
    commit_id: str
    lock_id: str | None
    fencing_token: int | None
    adds: tuple[SourceSpec, ...]
    updates: tuple[SourceUpdate, ...]
    removes: tuple[str, ...]
    #: (namespace, key, value) rows: namespace "external" or "property"; None deletes the key.
    key_values: tuple[tuple[str, str, Any], ...]
    schema_changes: tuple[Mapping[str, Any], ...]
    #: The history summary exactly as stored.
    summary: Mapping[str, Any]

    @property
    def touched(self) -> list[str]:
        """Existing sources this commit changes (lock and existence checks apply to them)."""
        return [u.source for u in self.updates] + list(self.removes)

    def to_json(self) -> str:
        """The commit as the Postgres commit function reads it."""
        return to_json(
            {
                "commit_id": self.commit_id,
                "lock_id": self.lock_id,
                "fencing_token": self.fencing_token,
                "adds": [
                    {
                        "name": a.name,
                        "kind": a.kind,
                        "config": a.config,
                        "partition": a.partition,
                        "state": a.state,
                    }
                    for a in self.adds
                ],
                "updates": [
                    {"source": u.source, "state": u.state, "expect": u.expect_state_version}
                    for u in self.updates
                ],
                "removes": list(self.removes),
                "kv": [{"ns": ns, "key": k, "value": v} for ns, k, v in self.key_values],
                "summary": self.summary,
            },
            "commit",
        )


def _adds(add_sources: Any) -> tuple[SourceSpec, ...]:
    adds = tuple(
        a if isinstance(a, SourceSpec) else SourceSpec.from_json(a)
        for a in as_list(add_sources, "add_sources")
    )
    for a in adds:
        check_source_name(a.name)
        to_json(
            {"config": a.config, "partition": a.partition, "state": a.state},
            f"source {a.name!r}",
        )
    return adds


def _updates(updates: Any) -> tuple[SourceUpdate, ...]:
    ups = tuple(
        u if isinstance(u, SourceUpdate) else SourceUpdate.from_json(u)
        for u in as_list(updates, "updates")
    )
    for u in ups:
        to_json(u.state, f"state of source {u.source!r}")
    return ups


_JSON_TYPES = {
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    list: "an array",
}


def _object(value: Any, what: str) -> dict[str, Any]:
    """An optional JSON object argument (None: empty); anything else is INVALID_ARGUMENT."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        got = _JSON_TYPES.get(type(value), type(value).__name__)
        raise InvalidArgument(f"{what} must be a JSON object, got {got}")
    out = {str(k): v for k, v in value.items()}
    to_json(out, what)
    return out


def _removes(remove_sources: Any) -> tuple[str, ...]:
    removes = tuple(as_list(remove_sources, "remove_sources"))
    if not all(isinstance(r, str) and r for r in removes):
        raise InvalidArgument("remove_sources must be a list of source names (strings)")
    return removes


def _lock_args(lock_id: Any, fencing_token: Any) -> None:
    if lock_id is not None and not isinstance(lock_id, str):
        raise InvalidArgument(f"lock_id must be a string, got {lock_id!r}")
    if fencing_token is not None and (
        isinstance(fencing_token, bool) or not isinstance(fencing_token, int)
    ):
        raise InvalidArgument(f"fencing_token must be an integer, got {fencing_token!r}")


def build_request(
    table: str,
    commit_id: str,
    *,
    lock_id: str | None,
    fencing_token: int | None,
    add_sources: Sequence[SourceSpec | Mapping[str, Any]],
    remove_sources: Sequence[str],
    updates: Sequence[SourceUpdate | Mapping[str, Any]],
    external_state: Mapping[str, Any] | None,
    properties: Mapping[str, Any] | None,
    schema_changes: Sequence[Mapping[str, Any]] | None,
    summary: Mapping[str, Any] | None,
) -> CommitRequest:
    """Validate a commit's arguments; everything here fails before the commit queues."""
    if not isinstance(commit_id, str) or not commit_id or len(commit_id) > 256:
        raise InvalidArgument("commit_id must be a non-empty string of at most 256 chars")
    _lock_args(lock_id, fencing_token)
    adds, ups = _adds(add_sources), _updates(updates)
    removes = _removes(remove_sources)
    ext, props = _object(external_state, "external_state"), _object(properties, "properties")
    changes = tuple(as_list(schema_changes, "schema_changes"))
    info = _object(summary, "summary")
    if not (adds or ups or removes or ext or props or changes):
        raise InvalidArgument(f"commit {commit_id!r} on table {table!r} changes nothing")
    names = [a.name for a in adds] + [u.source for u in ups] + list(removes)
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InvalidArgument(f"commit touches source(s) {dupes} more than once")
    info.update(
        {
            "updated": [u.source for u in ups],
            "added": [a.name for a in adds],
            "removed": list(removes),
            "external_state": sorted(ext),
            "properties": sorted(props),
            "schema_changes": len(changes),
        }
    )
    info.setdefault("operation", "commit")
    key_values = [("external", k, v) for k, v in ext.items()]
    key_values += [("property", k, v) for k, v in props.items()]
    return CommitRequest(
        commit_id, lock_id, fencing_token, adds, ups, removes, tuple(key_values), changes, info
    )
