"""Gateway settings: from CLI flags and an optional JSON/TOML file (``${ENV}`` resolved)."""

from __future__ import annotations

import json
import logging
import os
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flight_gateway.catalog.config import resolve_config

log = logging.getLogger(__name__)


@dataclass
class GatewayConfig:
    catalog: str = "sqlite:///harness-catalog.db"
    host: str = "127.0.0.1"
    port: int = 8815
    #: URIs of the replicas clients may fetch endpoints from (default: this server).
    locations: list[str] = field(default_factory=list)
    tokens: dict[str, Any] = field(default_factory=dict)
    allow_anonymous: bool = False
    ticket_key: str = ""
    ticket_ttl_s: float = 3600.0
    tls_cert: str | None = None
    tls_key: str | None = None

    @classmethod
    def load(cls, path: str | None, **overrides: Any) -> GatewayConfig:
        data: dict[str, Any] = {}
        if path:
            text = Path(path).read_text()
            data = tomllib.loads(text) if path.endswith(".toml") else json.loads(text)
            data = resolve_config(data, where=f"config file {path}")
        data.update({k: v for k, v in overrides.items() if v is not None})
        if not data.get("ticket_key"):
            data["ticket_key"] = os.environ.get("HARNESS_TICKET_KEY", "")
        cfg = cls(**data)
        return cfg

    def ticket_key_bytes(self) -> bytes:
        if not self.ticket_key:
            # Fine for one replica; replicas sharing a catalog must share a configured key.
            log.warning("no ticket_key configured: using a random per-process key")
            self.ticket_key = secrets.token_hex(32)
        return self.ticket_key.encode()
