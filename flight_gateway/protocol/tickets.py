"""Tickets: versioned, HMAC-SHA256-signed, expiring JSON. They carry no secrets.

Format: ``h1.<base64url(payload JSON)>.<base64url(HMAC(key, "h1." + payload))>``. Any replica
that shares the key (and the catalog) can serve any ticket.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

from flight_gateway.errors import InvalidArgument

_PREFIX = b"h1."


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

    def sign(self, payload: dict[str, Any], *, now: float | None = None) -> tuple[bytes, float]:
        """Return (ticket bytes, expiry epoch seconds)."""
        expires = (time.time() if now is None else now) + self.ttl_s
        body = _b64(
            json.dumps({**payload, "exp": expires}, separators=(",", ":"), sort_keys=True).encode()
        )
        signed = _PREFIX + body
        return signed + b"." + self._mac(signed), expires

    def verify(self, ticket: bytes, *, now: float | None = None) -> dict[str, Any]:
        if not ticket.startswith(_PREFIX) or ticket.count(b".") != 2:
            raise InvalidArgument("ticket is malformed or of an unknown version")
        signed, _, mac = ticket.rpartition(b".")
        if not hmac.compare_digest(mac, self._mac(signed)):
            raise InvalidArgument(
                "ticket signature is invalid (tampered, or signed with another key)"
            )
        try:
            payload = json.loads(_unb64(signed[len(_PREFIX) :]))
        except ValueError as e:
            raise InvalidArgument("ticket payload is malformed") from e
        if (time.time() if now is None else now) > float(payload.get("exp", 0)):
            raise InvalidArgument("ticket has expired; call GetFlightInfo again for fresh tickets")
        return payload
