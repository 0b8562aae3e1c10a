"""What source configs may make the gateway touch: the operator's allow-lists.

A kind lists what a config reaches (``SourceKind.reaches``: paths, hosts, URIs); the gateway
refuses the source — when it is committed and again before every read or write — unless each
entry is allowed by the ``reach`` section of the gateway config::

    "reach": {"paths": ["/srv/lake", "s3://bucket/lake/"],
              "hosts": ["127.0.0.1:5432", "broker-1:9092"],
              "uris":  ["http://registry:8081/", "grpc://upstream:8815"],
              "kinds": {"postgres": {"hosts": ["pg-shard-1:5432"]}}}

Local paths are compared after resolving symlinks and ``..``; URIs by normalised prefix; hosts
as ``host:port`` or ``host`` (any port). ``"any": true`` allows everything (local development).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from flight_gateway.errors import Unauthorized
from planners.kind import Reach


def _local(value: str) -> str | None:
    """The real local path of a plain path or a ``file:`` URI (None for other URIs)."""
    if value.startswith("file://"):
        value = urlsplit(value).path
    elif "://" in value:
        return None
    return os.path.realpath(os.path.abspath(value))


def _uri(value: str) -> str:
    parts = urlsplit(value)
    path = posixpath.normpath(parts.path) if parts.path else ""
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{'' if path == '.' else path}"


def _under(value: str, allowed: str) -> bool:
    mine, root = _local(value), _local(allowed)
    if mine is not None and root is not None:
        return mine == root or mine.startswith(root.rstrip("/") + "/")
    if mine is not None or root is not None or ".." in value.split("/"):
        return False
    v, a = _uri(value), _uri(allowed).rstrip("/")
    return v == a or v.startswith(a + "/")


def _host_ok(value: str, allowed: str) -> bool:
    host, _, port = value.lower().rpartition(":") if ":" in value else (value.lower(), "", "")
    a = allowed.lower()
    return a in (value.lower(), host) if port else a == host


@dataclass(frozen=True)
class ReachPolicy:
    any: bool = False
    paths: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    uris: tuple[str, ...] = ()
    kinds: Mapping[str, ReachPolicy] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ReachPolicy:
        unknown = sorted(set(d) - {"any", "paths", "hosts", "uris", "kinds"})
        if unknown:
            raise ValueError(f"unknown keys {unknown}")
        kinds = {k: cls.from_json(v) for k, v in dict(d.get("kinds", {})).items()}
        return cls(
            any=bool(d.get("any", False)),
            paths=tuple(str(p) for p in d.get("paths", ())),
            hosts=tuple(str(h) for h in d.get("hosts", ())),
            uris=tuple(str(u) for u in d.get("uris", ())),
            kinds=kinds,
        )

    def allows(self, kind: str, reach: Reach) -> bool:
        if self.any:
            return True
        extra = self.kinds.get(kind)
        if extra is not None and extra.allows(kind, reach):
            return True
        if reach.what == "path":
            return any(_under(reach.value, p) for p in self.paths)
        if reach.what == "host":
            return any(_host_ok(reach.value, h) for h in self.hosts)
        if reach.what == "uri":
            return any(_under(reach.value, u) for u in self.uris)
        return False

    def check(self, source: str, kind: str, reaches: list[Reach]) -> None:
        """PERMISSION_DENIED naming the config key (never its value, which may be a secret)."""
        for r in reaches:
            if not self.allows(kind, r):
                raise Unauthorized(
                    f"source {source!r}: config {r.key!r} names a {r.what} this gateway does not "
                    "allow (see the 'reach' section of the gateway config)"
                )
