"""What sources may make the gateway touch: the operator's allow-lists.

A kind lists what a config reaches (``SourceKind.reaches``: paths, hosts, URIs) in the form its
library will use them (``planners.locations``); while planning and reading it also reports every
file named in the metadata it reads (data, delete, manifest, log files) through the request's
guard. The gateway refuses the source — when it is committed, before every read or write and
before signing a direct task — unless each is allowed by the ``reach`` section of the gateway
config::

    "reach": {"paths": ["/srv/lake", "s3://bucket/lake/"],
              "hosts": ["127.0.0.1:5432", "broker-1:9092"],
              "uris":  ["http://registry:8081/", "grpc://upstream:8815"],
              "kinds": {"postgres": {"hosts": ["pg-shard-1:5432"]}},
              "tables": {"sales.*": {"paths": ["/srv/sales"]}}}

``tables`` scopes locations to tables: an entry (a table name pattern, with ``*``) grants its
locations to the sources of matching tables only, on top of the gateway-wide lists. ``reach``
is otherwise gateway-wide: an admin of one table may point a source at any allowed location,
another table's storage included. Locations a team's tables alone may use belong under their
pattern, not in the gateway-wide lists (docs/security.md, "Reach per table").

Allowed entries are normalised the same way as what they are compared with: local paths
resolved (symlinks, ``..``), URIs decoded with default ports explicit, hosts canonical (numeric
forms, case). Paths and URIs match by prefix at a ``/`` boundary; a host entry without a port
allows any port. ``"any": true`` allows everything (local development).
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flight_gateway.protocol.errors import InvalidArgument, Unauthorized
from planners import locations
from planners.kind import Reach

log = logging.getLogger(__name__)


def _norm_path(entry: str) -> str:
    readings = locations.storage("reach.paths", entry)
    return next(r.value for r in readings if r.what == "path")


def _norm_uri(entry: str) -> str:
    return locations.service_uri("reach.uris", entry).value


def _norm_host(entry: str) -> str:
    return locations.split_host_port(entry, "reach.hosts")


def _prefix(value: str, allowed: str) -> bool:
    if value.startswith("/") != allowed.startswith("/"):
        return False  # a local path never matches a URI, nor the other way round
    root = allowed.rstrip("/")
    return value in (allowed, root) or value.startswith(root + "/")


@dataclass(frozen=True)
class ReachPolicy:
    any: bool = False
    paths: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    uris: tuple[str, ...] = ()
    kinds: Mapping[str, ReachPolicy] = field(default_factory=dict)
    #: (table name pattern, the locations it grants those tables' sources besides these)
    tables: tuple[tuple[str, ReachPolicy], ...] = ()

    @classmethod
    def from_json(cls, d: Mapping[str, Any], scoped: bool = False) -> ReachPolicy:
        keys = {"paths", "hosts", "uris", "kinds"} | (set() if scoped else {"any", "tables"})
        unknown = sorted(set(d) - keys)
        if unknown:
            raise ValueError(f"unknown keys {unknown}")
        kinds = {k: cls.from_json(v, True) for k, v in dict(d.get("kinds", {})).items()}
        tables = tuple(
            (str(pattern), cls.from_json(v, True))
            for pattern, v in dict(d.get("tables", {})).items()
        )
        try:
            return cls(
                any=bool(d.get("any", False)),
                paths=tuple(_norm_path(str(p)) for p in d.get("paths", ())),
                hosts=tuple(_norm_host(str(h)) for h in d.get("hosts", ())),
                uris=tuple(_norm_uri(str(u)) for u in d.get("uris", ())),
                kinds=kinds,
                tables=tables,
            )
        except InvalidArgument as e:
            raise ValueError(str(e)) from e

    def allows(self, kind: str, reach: Reach, table: str = "") -> bool:
        if self.any:
            return True
        for pattern, scoped in self.tables:
            if table and fnmatch.fnmatchcase(table, pattern) and scoped.allows(kind, reach):
                return True
        extra = self.kinds.get(kind)
        if extra is not None and extra.allows(kind, reach):
            return True
        if reach.what == "path":
            return any(_prefix(reach.value, p) for p in self.paths)
        if reach.what == "host":
            return any(_host_matches(reach.value, h) for h in self.hosts)
        if reach.what == "uri":
            return any(_prefix(reach.value, u) for u in self.uris)
        return False

    def check(self, source: str, kind: str, reaches: Sequence[Reach], table: str = "") -> None:
        """PERMISSION_DENIED naming the config key (never its value, which may be a secret) or
        the kind of file, never the file's content."""
        for r in reaches:
            if not self.allows(kind, r, table):
                log.info("source %r: refused %s %s (%s)", source, r.what, r.value, r.key)
                where = f"a {r.key}" if " " in r.key else f"config {r.key!r}"
                prefix = f"source {source!r}: " if source else ""
                raise Unauthorized(
                    f"{prefix}{where} names a {r.what} this gateway does not allow (see the "
                    "'reach' section of the gateway config)"
                )


def _host_matches(value: str, allowed: str) -> bool:
    """``value`` is ``host:port`` (or a bare host, or a socket directory); ``allowed`` is the
    same, or a bare host allowing any port."""
    if value == allowed:
        return True
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        return False
    return host == allowed


@dataclass(frozen=True)
class PolicyGuard:
    """A scan request's guard (``planners.locations.Guard``): the policy for one kind."""

    policy: ReachPolicy
    kind: str
    table: str = ""

    @property
    def key(self) -> str:
        return f"{id(self.policy)}:{self.kind}:{self.table}"

    def check(self, source: str | None, reaches: Sequence[Reach]) -> None:
        self.policy.check(source or "", self.kind, reaches, self.table)
