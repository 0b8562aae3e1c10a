"""Statement handles: JSON sealed with an HMAC of the gateway's ticket key.

A handle carries everything needed to run a statement again (its SQL, bound parameters, the
pinned versions and the principal it was issued to), so the server keeps no per-statement state
and any replica sharing the ticket key can serve it. A tampered handle is refused, and so is an
expired one: like a ticket, a handle is valid for the gateway's ``ticket_ttl_s`` from when it was
sealed (its expiry, ``exp``, is sealed with it).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

from flight_gateway.protocol.errors import InvalidArgument

PREFIX = b"hsql2."


class HandleSealer:
    def __init__(self, key: bytes, ttl_s: float = 3600.0) -> None:
        self._key = hashlib.sha256(b"flight-sql-handles\0" + key).digest()
        self.ttl_s = ttl_s

    def _mac(self, body: bytes) -> bytes:
        return base64.urlsafe_b64encode(hmac.new(self._key, body, hashlib.sha256).digest())

    def seal(self, value: dict[str, Any], *, now: float | None = None) -> bytes:
        """``value`` sealed; valid ``ttl_s`` from now, or until its ``exp`` when it has one (a
        handle sealed again keeps its expiry: binding parameters does not renew it)."""
        expires = value.get("exp")
        if not isinstance(expires, int | float):
            expires = (time.time() if now is None else now) + self.ttl_s
        text = json.dumps({**value, "exp": expires}, separators=(",", ":"))
        body = base64.urlsafe_b64encode(text.encode())
        return PREFIX + body + b"." + self._mac(body)

    def open(
        self, handle: bytes, *, now: float | None = None, keep_expiry: bool = False
    ) -> dict[str, Any]:
        """The sealed value (without ``exp`` unless ``keep_expiry``); INVALID_ARGUMENT if
        tampered with or expired."""
        if not handle.startswith(PREFIX) or handle.count(b".") != 2:
            raise InvalidArgument("not a statement handle of this server")
        body, mac = handle[len(PREFIX) :].split(b".")
        if not hmac.compare_digest(mac, self._mac(body)):
            raise InvalidArgument("statement handle was tampered with or issued by another key")
        value: dict[str, Any] = json.loads(base64.urlsafe_b64decode(body))
        expires = value.pop("exp", None)
        if not isinstance(expires, int | float) or (time.time() if now is None else now) > expires:
            raise InvalidArgument(
                "statement handle has expired; prepare or run the statement again"
            )
        if keep_expiry:
            value["exp"] = expires
        return value
