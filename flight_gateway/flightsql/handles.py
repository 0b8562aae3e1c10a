"""Statement handles: JSON sealed with an HMAC of the gateway's ticket key.

A handle carries everything needed to run a statement again (its SQL, bound parameters, the
pinned versions and the principal it was issued to), so the server keeps no per-statement state
and any replica sharing the ticket key can serve it. A tampered handle is refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

from flight_gateway.errors import InvalidArgument

PREFIX = b"hsql1."


class HandleSealer:
    def __init__(self, key: bytes) -> None:
        self._key = hashlib.sha256(b"flight-sql-handles\0" + key).digest()

    def seal(self, value: dict[str, Any]) -> bytes:
        body = base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode())
        mac = base64.urlsafe_b64encode(hmac.new(self._key, body, hashlib.sha256).digest())
        return PREFIX + body + b"." + mac

    def open(self, handle: bytes) -> dict[str, Any]:
        if not handle.startswith(PREFIX) or handle.count(b".") != 2:
            raise InvalidArgument("not a statement handle of this server")
        body, mac = handle[len(PREFIX) :].split(b".")
        want = base64.urlsafe_b64encode(hmac.new(self._key, body, hashlib.sha256).digest())
        if not hmac.compare_digest(mac, want):
            raise InvalidArgument("statement handle was tampered with or issued by another key")
        value: dict[str, Any] = json.loads(base64.urlsafe_b64decode(body))
        return value
