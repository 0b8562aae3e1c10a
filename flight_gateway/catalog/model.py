"""Values the catalog takes and returns. Plain frozen dataclasses; JSON-friendly fields."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flight_gateway.catalog.schema import Schema
from flight_gateway.protocol.errors import InvalidArgument, NotFound

#: What a new source and a state update may say: a misspelt ``expect_state_version`` must not
#: commit without its check.
_SPEC_KEYS = frozenset({"name", "kind", "config", "partition", "state"})
_UPDATE_KEYS = frozenset({"source", "state", "expect_state_version"})


def _known(d: Mapping[str, Any], keys: frozenset[str], what: str) -> None:
    unknown = sorted(str(k) for k in d if k not in keys)
    if unknown:
        raise InvalidArgument(f"{what}: unknown key(s) {unknown} (known: {sorted(keys)})")


@dataclass(frozen=True)
class SourceSpec:
    """A source to add: its initial state is committed with it."""

    name: str
    kind: str
    config: Mapping[str, Any] = field(default_factory=dict)
    partition: Mapping[str, Any] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SourceSpec:
        if not isinstance(d, Mapping) or not d.get("name") or not d.get("kind"):
            raise InvalidArgument(f"a source needs at least 'name' and 'kind': {d!r}")
        _known(d, _SPEC_KEYS, f"source {d['name']!r}")
        for key in ("config", "partition", "state"):
            if not isinstance(d.get(key, {}), Mapping):
                raise InvalidArgument(f"source {d['name']!r}: {key} must be an object")
        return cls(
            str(d["name"]),
            str(d["kind"]),
            dict(d.get("config", {})),
            dict(d.get("partition", {})),
            dict(d.get("state", {})),
        )


@dataclass(frozen=True)
class SourceUpdate:
    """A new state for an existing source, optionally compare-and-set on its state version."""

    source: str
    state: Mapping[str, Any]
    expect_state_version: int | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SourceUpdate:
        if not isinstance(d, Mapping) or "source" not in d or "state" not in d:
            raise InvalidArgument(f"an update needs 'source' and 'state': {d!r}")
        _known(d, _UPDATE_KEYS, f"update of {d['source']!r}")
        if not isinstance(d["state"], Mapping):
            raise InvalidArgument(f"update of {d['source']!r}: state must be an object")
        esv = d.get("expect_state_version")
        if esv is not None and (
            isinstance(esv, bool) or not isinstance(esv, int) or not 0 <= esv < 2**63
        ):
            raise InvalidArgument(
                f"update of {d['source']!r}: expect_state_version must be an int >= 0 and < 2**63"
            )
        return cls(str(d["source"]), dict(d["state"]), esv)


@dataclass(frozen=True)
class SourceDef:
    """What a source is, as fixed when it was added (a state update never changes it)."""

    name: str
    kind: str
    config: Mapping[str, Any]
    partition: Mapping[str, Any]


@dataclass(frozen=True)
class SourceSnapshot:
    """A source as of one table version."""

    name: str
    kind: str
    config: Mapping[str, Any]
    partition: Mapping[str, Any]
    state: Mapping[str, Any]
    #: How many times this source's state was set (1 when added); the compare-and-set token.
    state_version: int
    added_version: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "config": dict(self.config),
            "partition": dict(self.partition),
            "state": dict(self.state),
            "state_version": self.state_version,
            "added_version": self.added_version,
        }


@dataclass(frozen=True)
class TableHead:
    """A table's identity and the versions it keeps now (one primary-key lookup)."""

    table_id: int
    current_version: int
    min_version: int
    #: The version current at the ``as_of`` the head was asked for (None: none was given).
    version_at: int | None = None


@dataclass(frozen=True)
class TableSnapshot:
    """Everything a reader needs to read one pinned table version."""

    table: str
    version: int
    committed_at: float
    schema: Schema
    partition_by: tuple[str, ...]
    primary_key: tuple[str, ...]
    properties: Mapping[str, Any]
    external_state: Mapping[str, Any]
    sources: tuple[SourceSnapshot, ...]
    #: The catalog's id of this incarnation of the table: a table dropped and created again
    #: under the same name has another one (caches, tickets and handles carry it).
    table_id: int = 0

    def source(self, name: str) -> SourceSnapshot:
        for s in self.sources:
            if s.name == name:
                return s
        raise NotFound(f"source {name!r} not in table {self.table!r} at version {self.version}")

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "version": self.version,
            "committed_at": self.committed_at,
            "schema": self.schema.to_json(),
            "partition_by": list(self.partition_by),
            "primary_key": list(self.primary_key),
            "properties": dict(self.properties),
            "external_state": dict(self.external_state),
            "sources": [s.to_json() for s in self.sources],
        }


@dataclass(frozen=True)
class CommitInfo:
    version: int
    committed_at: float
    commit_id: str
    schema_id: int
    summary: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "committed_at": self.committed_at,
            "commit_id": self.commit_id,
            "schema_id": self.schema_id,
            "summary": dict(self.summary),
        }


@dataclass(frozen=True)
class CommitResult:
    version: int
    #: False when the commit_id had already been applied and this call changed nothing.
    applied: bool
    schema_id: int


@dataclass(frozen=True)
class LockGrant:
    lock_id: str
    table: str
    sources: tuple[str, ...]
    owner: str
    fencing_token: int
    expires_at: float


@dataclass(frozen=True)
class LockInfo:
    """A lock as the catalog stores it: who holds (or waits for) which sources of which table.

    Lets a server check that whoever renews or releases a lock may write its table and owns it.
    """

    lock_id: str
    table: str
    owner: str
    sources: tuple[str, ...]
    #: False while the request waits in the queue.
    granted: bool
    fencing_token: int | None
    #: End of the lease (granted) or of the waiter's heartbeat (queued), epoch seconds.
    expires_at: float
