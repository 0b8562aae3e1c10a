"""Gateway settings: CLI flags and an optional JSON/TOML file (docs/security.md).

The file is the operator's: ``${NAME}`` in it (keys too — token keys are secrets) is resolved
from the environment, and an unset variable stops the gateway from starting. Source configs, in
contrast, are written by table writers and may only reference the names ``secrets.allow``
permits (``flight_gateway.secrets``).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flight_gateway.errors import InvalidArgument
from flight_gateway.secrets import DEFAULT_ALLOWED, REF, SecretResolver
from flight_gateway.server.auth import TokenStore
from flight_gateway.server.reach import ReachPolicy

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from flight_gateway.flightsql.engine import SqlLimits


@dataclass(frozen=True)
class Limits:
    """Bounds on what one call may cost: INVALID_ARGUMENT beyond most of them, RESOURCE_EXHAUSTED
    beyond the upload and concurrency ones (docs/security.md, "Limits" and "DoPut")."""

    #: Decoded Arrow bytes of one DoPut, checked as each batch is decoded.
    max_upload_bytes: int = 1 << 30
    max_tasks: int = 10_000
    max_lock_wait_s: float = 300.0
    #: Lease of the locks the gateway takes for a DoPut or an engine write, renewed every
    #: third of it while the write runs: after a gateway dies mid-write, its sources are
    #: free again this long after.
    write_lease_s: float = 10.0
    max_streams_per_principal: int = 64
    #: DoPut calls one principal may have in progress at once.
    max_uploads_per_principal: int = 4
    #: DoPut calls the whole gateway decodes and holds at once (all principals).
    max_concurrent_uploads: int = 8
    #: Kafka consumers open at once in the whole process (0: two per core, at least 4); a read
    #: waits up to ``kafka_consumer_wait_s`` for one (``planners.kafka.consumers``).
    max_kafka_consumers: int = 0
    kafka_consumer_wait_s: float = 60.0
    max_dedupe_rows: int = 20_000_000
    max_since_versions: int = 100_000
    #: Flight SQL statements the whole gateway runs at once (each also holds one of its
    #: caller's ``max_streams_per_principal``).
    max_concurrent_statements: int = 4
    #: DuckDB memory of one statement; past it DuckDB spills to ``sql_temp_dir``.
    sql_memory_limit_mb: int = 1024
    #: Disk one statement may spill to.
    sql_spill_limit_mb: int = 10 * 1024
    #: DuckDB threads per statement (0: one per core).
    sql_threads: int = 0
    #: A statement running longer is interrupted (DEADLINE_EXCEEDED).
    sql_timeout_s: float = 300.0
    #: Where statements spill (a directory per statement, removed when it ends); None: the
    #: system's temporary directory.
    sql_temp_dir: str | None = None

    def __post_init__(self) -> None:
        for name in (
            "max_uploads_per_principal",
            "max_concurrent_uploads",
            "max_concurrent_statements",
            "sql_memory_limit_mb",
            "sql_spill_limit_mb",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"limits.{name} must be a positive integer, not {value!r}")
        for name in ("sql_threads", "max_kafka_consumers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"limits.{name} must be 0 or more, not {value!r}")
        for name in ("sql_timeout_s", "write_lease_s", "kafka_consumer_wait_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"limits.{name} must be positive, not {value!r}")

    def sql(self) -> SqlLimits:
        """The per-statement limits of Flight SQL (``flight_gateway.flightsql.engine``)."""
        from flight_gateway.flightsql.engine import SqlLimits

        return SqlLimits(
            memory_limit_mb=self.sql_memory_limit_mb,
            threads=self.sql_threads,
            timeout_s=float(self.sql_timeout_s),
            spill_limit_mb=self.sql_spill_limit_mb,
            temp_dir=self.sql_temp_dir,
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Limits:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown limits {unknown} (known: {sorted(known)})")
        return cls(**d)


def _resolve_file(value: Any, path: str) -> Any:
    """``${NAME}`` in the operator's config file, keys included, from the environment."""

    def sub(text: str) -> str:
        def one(m: Any) -> str:
            name = m.group(1)
            if name not in os.environ:
                raise ValueError(f"config file {path} references ${{{name}}}, which is not set")
            return os.environ[name]

        return str(REF.sub(one, text))

    if isinstance(value, str):
        return sub(value)
    if isinstance(value, Mapping):
        return {sub(str(k)): _resolve_file(v, path) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_file(v, path) for v in value]
    return value


@dataclass
class GatewayConfig:
    catalog: str = "sqlite:///harness-catalog.db"
    host: str = "127.0.0.1"
    port: int = 8815
    #: URIs of the replicas clients may fetch endpoints from (default: this server).
    locations: list[str] = field(default_factory=list)
    #: bearer token -> {"name", "read": [patterns], "write": [...], "admin": [...]}; every
    #: token and certificate needs its own ``name`` (its principal).
    tokens: dict[str, Any] = field(default_factory=dict)
    allow_anonymous: bool = False
    #: What anonymous callers may do when tokens are configured (default: nothing).
    anonymous: dict[str, Any] = field(default_factory=dict)
    ticket_key: str = ""
    ticket_ttl_s: float = 3600.0
    tls_cert: str | None = None
    tls_key: str | None = None
    #: CA bundle to verify client certificates (mutual TLS); ``certs`` maps a certificate's
    #: subject to the same grants as a token.
    tls_client_ca: str | None = None
    certs: dict[str, Any] = field(default_factory=dict)
    #: What source configs may make the gateway touch (paths, hosts, URIs).
    reach: dict[str, Any] = field(default_factory=dict)
    #: ``{"allow": [name patterns]}``: ``${NAME}`` references source configs may use.
    secrets: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    #: Serve Prometheus metrics on this port (``/metrics``); off when unset. 0 picks a port.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    #: ``"text"`` or ``"json"`` (one JSON object per log line), for ``harness-gateway serve``.
    log_format: str = "text"
    #: OpenTelemetry (flight_gateway.tracing): {exporter = "otlp" | "console" | "file",
    #: endpoint?, path?}; None: off.
    tracing: dict[str, Any] | None = None
    #: The Iceberg REST catalog face (flight_gateway.rest): its port (0: any free one), None:
    #: off; pinned versions are materialized under ``iceberg_rest_dir`` (default: a temporary
    #: directory of the process).
    iceberg_rest_port: int | None = None
    iceberg_rest_dir: str | None = None

    def __post_init__(self) -> None:
        for what, value in [
            ("ticket_key", self.ticket_key),
            *[("a token", t) for t in self.tokens],
        ]:
            if isinstance(value, str) and REF.search(value):
                raise ValueError(f"{what} is still an unresolved ${{...}} reference")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
        self.token_store  # noqa: B018 - every token and certificate named, names unique
        self.reach_policy  # noqa: B018 - validates the section at start-up
        self.limit_values  # noqa: B018
        SecretResolver(self.secret_names)  # secrets.allow rules are well formed

    @classmethod
    def load(cls, path: str | None, **overrides: Any) -> GatewayConfig:
        data: dict[str, Any] = {}
        if path:
            text = Path(path).read_text()
            data = tomllib.loads(text) if path.endswith(".toml") else json.loads(text)
            data = _resolve_file(data, path)
        data.update({k: v for k, v in overrides.items() if v is not None})
        if not data.get("ticket_key"):
            data["ticket_key"] = os.environ.get("HARNESS_TICKET_KEY", "")
        return cls(**data)

    @property
    def token_store(self) -> TokenStore:
        return TokenStore.from_config(self.tokens, self.allow_anonymous, self.anonymous, self.certs)

    @property
    def reach_policy(self) -> ReachPolicy:
        if not self.reach and not self.tokens and self.allow_anonymous:
            # Local development (anonymous, no tokens, no allow-list): nothing to protect.
            return ReachPolicy(any=True)
        try:
            return ReachPolicy.from_json(self.reach)
        except (ValueError, TypeError, InvalidArgument) as e:
            raise ValueError(f"invalid 'reach' section: {e}") from e

    @property
    def limit_values(self) -> Limits:
        return Limits.from_json(self.limits)

    @property
    def secret_names(self) -> tuple[Any, ...]:
        """``secrets.allow``: name patterns, or ``{"names", "tables"}`` rules (secrets.py)."""
        return tuple(self.secrets.get("allow", DEFAULT_ALLOWED))

    def ticket_key_bytes(self) -> bytes:
        if not self.ticket_key:
            # Fine for one replica; replicas sharing a catalog must share a configured key.
            log.warning("no ticket_key configured: using a random per-process key")
            self.ticket_key = secrets.token_hex(32)
        return self.ticket_key.encode()
