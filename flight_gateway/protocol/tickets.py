"""Tickets: versioned, HMAC-SHA256-signed, expiring JSON. They carry no secrets.

Format: ``h2.<base64url(payload JSON)>.<base64url(HMAC(key, "h2." + payload))>``. Any replica
that shares the key (and the catalog) can serve any ticket. The payload is ``TicketPayload``:
which table version, which source (or which sources, for a primary-key view endpoint), the kind's
task, the projection, filter and limit, and the principal the ticket was issued to. A source's
kind, config and state are never in a ticket: they are read from the catalog at the pinned
version when the ticket is served.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from flight_gateway.protocol.errors import InvalidArgument

TICKET_VERSION = 2
_PREFIX = f"h{TICKET_VERSION}.".encode()


@dataclass(frozen=True)
class TicketPayload:
    """What a DoGet needs to serve one endpoint, as signed at planning."""

    table: str
    version: int
    columns: tuple[str, ...]
    filter: str | None = None
    limit: int | None = None
    #: A plain or streaming endpoint: the source and the kind's task payload.
    source: str | None = None
    task: Mapping[str, Any] = field(default_factory=dict)
    exact: bool = False
    #: A primary-key view endpoint: the sources deduplicated together.
    dedupe_sources: tuple[str, ...] | None = None
    #: The principal the ticket was issued to (checked on DoGet).
    principal: str | None = None
    expires_at: float = 0.0
    #: The catalog's id of the table's incarnation: a ticket of a table since dropped (and
    #: perhaps created again) is refused, never served from the new one.
    table_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "table": self.table,
            "version": self.version,
            "columns": list(self.columns),
            "filter": self.filter,
            "limit": self.limit,
            "exact": self.exact,
            "exp": self.expires_at,
        }
        if self.source is not None:
            d["source"], d["task"] = self.source, dict(self.task)
        if self.dedupe_sources is not None:
            d["dedupe_sources"] = list(self.dedupe_sources)
        if self.principal is not None:
            d["principal"] = self.principal
        if self.table_id is not None:
            d["table_id"] = self.table_id
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TicketPayload:
        try:
            dedupe = d.get("dedupe_sources")
            return cls(
                table=str(d["table"]),
                version=int(d["version"]),
                columns=tuple(str(c) for c in d["columns"]),
                filter=d.get("filter"),
                limit=d.get("limit"),
                source=d.get("source"),
                task=dict(d.get("task") or {}),
                exact=bool(d.get("exact", False)),
                dedupe_sources=tuple(dedupe) if dedupe is not None else None,
                principal=d.get("principal"),
                expires_at=float(d["exp"]),
                table_id=int(d["table_id"]) if d.get("table_id") is not None else None,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidArgument(f"ticket payload is malformed: {e}") from e


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _unb64(data: bytes) -> bytes:
    return base64.urlsafe_b64decode(data + b"=" * (-len(data) % 4))


class TicketSigner:
    def __init__(self, key: bytes, ttl_s: float = 3600.0) -> None:
        if len(key) < 16:
            raise ValueError("ticket key must be at least 16 bytes")
        self._key = key
        self.ttl_s = ttl_s

    def _mac(self, signed: bytes) -> bytes:
        return _b64(hmac.new(self._key, signed, hashlib.sha256).digest())

    def sign(self, payload: TicketPayload, *, now: float | None = None) -> tuple[bytes, float]:
        """Return (ticket bytes, expiry epoch seconds)."""
        expires = (time.time() if now is None else now) + self.ttl_s
        text = json.dumps(
            replace(payload, expires_at=expires).to_json(), separators=(",", ":"), sort_keys=True
        )
        signed = _PREFIX + _b64(text.encode())
        return signed + b"." + self._mac(signed), expires

    def verify(self, ticket: bytes, *, now: float | None = None) -> TicketPayload:
        if not ticket.startswith(_PREFIX) or ticket.count(b".") != 2:
            raise InvalidArgument("ticket is malformed or of an unknown version")
        signed, _, mac = ticket.rpartition(b".")
        if not hmac.compare_digest(mac, self._mac(signed)):
            raise InvalidArgument(
                "ticket signature is invalid (tampered, or signed with another key)"
            )
        try:
            raw = json.loads(_unb64(signed[len(_PREFIX) :]))
        except ValueError as e:
            raise InvalidArgument("ticket payload is malformed") from e
        if not isinstance(raw, dict):
            raise InvalidArgument("ticket payload is malformed")
        payload = TicketPayload.from_json(raw)
        if (time.time() if now is None else now) > payload.expires_at:
            raise InvalidArgument("ticket has expired; call GetFlightInfo again for fresh tickets")
        return payload
