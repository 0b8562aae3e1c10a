"""Typed results of ``harness.describe`` and ``harness.history`` for clients and pipelines.

The wire carries JSON (docs/protocol.md); these frozen dataclasses are what the Python client
returns, so callers write ``info.source("k0").state["high"]`` rather than digging in dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flight_gateway.protocol.errors import NotFound


@dataclass(frozen=True)
class FieldInfo:
    id: int
    name: str
    type: str
    nullable: bool = True
    aliases: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FieldInfo:
        return cls(
            int(d["id"]),
            str(d["name"]),
            str(d["type"]),
            bool(d.get("nullable", True)),
            tuple(d.get("aliases", ())),
        )


@dataclass(frozen=True)
class SourceInfo:
    name: str
    kind: str
    #: The source's config as stored (``${NAME}`` references unresolved, secrets redacted).
    config: Mapping[str, Any]
    partition: Mapping[str, Any]
    state: Mapping[str, Any]
    state_version: int
    added_version: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SourceInfo:
        return cls(
            str(d["name"]),
            str(d["kind"]),
            dict(d.get("config", {})),
            dict(d.get("partition", {})),
            dict(d.get("state", {})),
            int(d.get("state_version", 0)),
            int(d.get("added_version", 0)),
        )


@dataclass(frozen=True)
class TableInfo:
    table: str
    version: int
    committed_at: float
    schema_id: int
    schema: tuple[FieldInfo, ...]
    partition_by: tuple[str, ...]
    primary_key: tuple[str, ...]
    sources: tuple[SourceInfo, ...]
    properties: Mapping[str, Any] = field(default_factory=dict)
    external_state: Mapping[str, Any] = field(default_factory=dict)

    def source(self, name: str) -> SourceInfo:
        for s in self.sources:
            if s.name == name:
                return s
        raise NotFound(f"source {name!r} not in table {self.table!r} at version {self.version}")

    def field(self, name: str) -> FieldInfo:
        for f in self.schema:
            if f.name == name:
                return f
        raise NotFound(f"column {name!r} not in table {self.table!r} at version {self.version}")

    @property
    def column_names(self) -> list[str]:
        return [f.name for f in self.schema]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TableInfo:
        return cls(
            table=str(d["table"]),
            version=int(d["version"]),
            committed_at=float(d["committed_at"]),
            schema_id=int(d.get("schema_id", 0)),
            schema=tuple(FieldInfo.from_json(f) for f in d["schema"]),
            partition_by=tuple(d.get("partition_by", ())),
            primary_key=tuple(d.get("primary_key", ())),
            sources=tuple(SourceInfo.from_json(s) for s in d.get("sources", ())),
            properties=dict(d.get("properties", {})),
            external_state=dict(d.get("external_state", {})),
        )


@dataclass(frozen=True)
class CommitRecord:
    version: int
    committed_at: float
    commit_id: str
    schema_id: int
    summary: Mapping[str, Any]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CommitRecord:
        return cls(
            int(d["version"]),
            float(d["committed_at"]),
            str(d["commit_id"]),
            int(d.get("schema_id", 0)),
            dict(d.get("summary", {})),
        )
