"""Gateway settings: CLI flags and an optional JSON/TOML file (docs/security.md).

The file is the operator's: ``${NAME}`` in it (keys too — token keys are secrets) is resolved
from the environment, and an unset variable stops the gateway from starting. Source configs, in
contrast, are written by table writers and may only reference the names ``secrets.allow``
permits (``flight_gateway.core.secrets``).
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import secrets
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flight_gateway.core.auth import TokenStore
from flight_gateway.core.limits import Limits
from flight_gateway.core.reach import ReachPolicy
from flight_gateway.core.secrets import DEFAULT_ALLOWED, REF, SecretResolver
from flight_gateway.protocol.errors import InvalidArgument

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """The gateway config file is wrong; the message names the file and the setting."""


def check_keys(data: Mapping[str, Any], known: set[str], where: str) -> None:
    """Every key of ``data`` is a setting; else ConfigError naming the closest one."""
    for key, value in data.items():
        if key in known:
            continue
        # "iceberg_rest": {"port": ...} for iceberg_rest_port: the flat setting it spells
        flat = [f"{key}_{sub}" for sub in value] if isinstance(value, Mapping) else []
        close = [f for f in flat if f in known] or difflib.get_close_matches(
            str(key), sorted(known), n=1, cutoff=0.5
        )
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"{where}: {key}: unknown setting{hint}")


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


@dataclass(frozen=True)
class RestSettings:
    """The Iceberg REST face (``iceberg_rest`` in the config; docs/security.md)."""

    #: Disk the slice store (hot slices and metadata) may fill; past it, loads that would write
    #: more fail with RESOURCE_EXHAUSTED (after a sweep of what no kept version uses).
    disk_budget_mb: int = 10 * 1024
    #: A loaded version's files stay at least this long after each load (engines read them
    #: after the load returns), even when the version expires meanwhile.
    pin_s: float = 3600.0
    #: Kept versions listed in a table's snapshot history (time travel by snapshot id).
    history: int = 16
    #: Loads that make slices, per principal and gateway-wide, at once.
    max_loads_per_principal: int = 2
    max_concurrent_loads: int = 4
    #: Requests being answered at once; more are answered 503 at once.
    max_requests: int = 64
    #: Requests of one principal answered at once; up to as many more wait up to
    #: ``request_wait_s`` for one to end (on the event loop, holding no thread), then are
    #: answered 503, as are any beyond those. Table loads run on 16 threads: a principal
    #: whose loads wait on a slow source (or on a source that points back at this face, each
    #: level a load of its own) holds at most this many.
    max_requests_per_principal: int = 8
    #: How long a principal's request over ``max_requests_per_principal`` waits for a place:
    #: an engine loading many tables at once (Trino's metadata parallelism is 8 per query)
    #: waits a moment rather than failing (pyiceberg does not retry a 503). 0: 503 at once.
    request_wait_s: float = 2.0
    #: Connections open at once; more are closed as they arrive.
    max_connections: int = 1024
    #: A request's headers must arrive within this; an idle keep-alive connection closes after it.
    header_timeout_s: float = 10.0
    #: Store files readable by the gateway's group (an engine running as another user); else
    #: owner only.
    group_readable: bool = False
    #: Seconds between sweeps of what no kept version uses.
    sweep_s: float = 60.0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RestSettings:
        for flat in ("port", "dir"):  # top-level settings: iceberg_rest_port, iceberg_rest_dir
            if flat in data:
                raise ConfigError(
                    f"iceberg_rest: {flat}: unknown setting (did you mean iceberg_rest_{flat}?)"
                )
        check_keys(data, set(cls.__dataclass_fields__), "iceberg_rest")
        try:
            out = cls(**data)
        except TypeError as e:
            raise ConfigError(f"iceberg_rest: {e}") from None
        for name in ("disk_budget_mb", "history", "max_loads_per_principal",
                     "max_concurrent_loads", "max_requests", "max_requests_per_principal",
                     "max_connections"):  # fmt: skip
            value = getattr(out, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"iceberg_rest.{name} must be a positive integer")
        for name in ("pin_s", "header_timeout_s", "sweep_s", "request_wait_s"):
            value = getattr(out, name)
            least = 0 if name == "request_wait_s" else 1e-9
            if not isinstance(value, int | float) or isinstance(value, bool) or value < least:
                raise ConfigError(f"iceberg_rest.{name} must be a positive number")
            if not math.isfinite(value):
                raise ConfigError(f"iceberg_rest.{name} must be finite")
        return out


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
    #: OpenTelemetry (flight_gateway.core.tracing): {exporter = "otlp" | "console" | "file",
    #: endpoint?, path?}; None: off.
    tracing: dict[str, Any] | None = None
    #: The Iceberg REST catalog face (flight_gateway.faces.iceberg_rest): its port (0: any free one), None:
    #: off; pinned versions are materialized under ``iceberg_rest_dir`` (default: a temporary
    #: directory of the process).
    iceberg_rest_port: int | None = None
    iceberg_rest_dir: str | None = None
    #: Its bounds (``RestSettings``).
    iceberg_rest: dict[str, Any] = field(default_factory=dict)
    #: DoGet streams are read in this many processes of their own (0: in the gateway's), so
    #: the readers' Python does not hold the interpreter lock its writers need
    #: (flight_gateway.faces.flight.readers). Needs a catalog other processes can open.
    read_processes: int = 0
    #: Their ``nice`` increment (0-19): on busy cores the gateway's writers go first.
    read_processes_nice: int = 5
    #: At most this many of a read process's streams make a batch at once (0: no bound). The
    #: kernel shares cores by thread, not by process: 64 streams' threads at nice 5 outweighed
    #: the gateway's few writer threads at nice 0. One per read process left the writers the
    #: cores (docs/operations.md, "Read processes"); where reads wait on remote storage rather
    #: than on the cores, leave it 0.
    read_processes_running: int = 0

    def __post_init__(self) -> None:
        for what, value in [
            ("ticket_key", self.ticket_key),
            *[("a token", t) for t in self.tokens],
        ]:
            if isinstance(value, str) and REF.search(value):
                raise ValueError(f"{what} is still an unresolved ${{...}} reference")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        rp = self.read_processes
        if not isinstance(rp, int) or isinstance(rp, bool) or not 0 <= rp <= 64:
            raise ValueError(f"read_processes must be 0 to 64, not {self.read_processes!r}")
        rn = self.read_processes_nice
        if not isinstance(rn, int) or isinstance(rn, bool) or not 0 <= rn <= 19:
            raise ValueError(f"read_processes_nice must be 0 to 19, not {rn!r}")
        rr = self.read_processes_running
        if not isinstance(rr, int) or isinstance(rr, bool) or not 0 <= rr <= 4096:
            raise ValueError(f"read_processes_running must be 0 to 4096, not {rr!r}")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
        self.token_store  # noqa: B018 - every token and certificate named, names unique
        self.reach_policy  # noqa: B018 - validates the section at start-up
        self.limit_values  # noqa: B018
        self.rest_settings  # noqa: B018
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
        where = path or "the gateway config"
        check_keys(data, set(cls.__dataclass_fields__), where)
        check_keys(data.get("limits") or {}, set(Limits.__dataclass_fields__), f"{where}: limits")
        try:
            return cls(**data)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {e}") from None

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
    def rest_settings(self) -> RestSettings:
        return RestSettings.from_json(self.iceberg_rest or {})

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
