"""Direct tasks: a planned read of cold files that the client runs itself (DESIGN.md §10).

The gateway pins, prunes, plans and authorizes; for file-based sources it may describe a task as
"read these files, in this format, mapping these physical columns (Parquet field id, then names)
to these harness columns (missing ones null, narrower types widened), keep the rows this filter
accepts". A client that can reach the storage reads the files where it runs, in parallel, with
C++ readers; one that cannot uses the endpoint's Flight ticket, which stays valid for every task
and returns the same rows.

On the wire a direct task travels in its endpoint's ``app_metadata`` as
``{"direct": "hd1.<base64url(JSON)>.<base64url(Ed25519 signature)>"}``. The gateway signs with a
key derived from its ticket key (replicas sharing the ticket key share it); clients verify with
the public key of ``harness.public_key`` and refuse a tampered or expired task. The residual
filter is given twice: as Substrait (an Arrow compute expression over ``columns``, exactly what
the gateway would apply) and as harness filter text (SQL, for engines such as Spark).
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

DIRECT_PREFIX = "hd1."


@dataclass(frozen=True)
class DirectColumn:
    """One column the task produces: harness name and type, and how to find it in a file."""

    name: str
    type: str
    #: Physical names to try, in order (current name, then former names).
    names: tuple[str, ...]
    #: Parquet field id (Iceberg data files), tried before the names.
    field_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "names": list(self.names),
            "field_id": self.field_id,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DirectColumn:
        fid = d.get("field_id")
        return cls(
            str(d["name"]), str(d["type"]), tuple(d["names"]), int(fid) if fid is not None else None
        )


@dataclass(frozen=True)
class DirectTask:
    table: str
    version: int
    source: str
    #: ``parquet``, ``orc``, ``ipc`` or ``csv``
    format: str
    #: Absolute paths or URIs (``file://``, ``s3://``, ...), read in this order.
    files: tuple[str, ...]
    #: What to read: the projection, then the columns only the filter needs.
    columns: tuple[DirectColumn, ...]
    #: The projection (output column names, in order).
    output: tuple[str, ...]
    #: The residual filter as harness filter text (None: keep every row).
    filter: str | None = None
    #: The same filter as base64 Substrait over ``columns`` (``pyarrow.compute.Expression``).
    filter_substrait: str | None = None
    #: Columns with one value for the whole task (``_source``).
    constants: Mapping[str, Any] = field(default_factory=dict)
    principal: str | None = None
    expires_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "version": self.version,
            "source": self.source,
            "format": self.format,
            "files": list(self.files),
            "columns": [c.to_json() for c in self.columns],
            "output": list(self.output),
            "filter": self.filter,
            "filter_substrait": self.filter_substrait,
            "constants": dict(self.constants),
            "principal": self.principal,
            "exp": self.expires_at,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DirectTask:
        try:
            return cls(
                table=str(d["table"]),
                version=int(d["version"]),
                source=str(d["source"]),
                format=str(d["format"]),
                files=tuple(str(f) for f in d["files"]),
                columns=tuple(DirectColumn.from_json(c) for c in d["columns"]),
                output=tuple(str(c) for c in d["output"]),
                filter=d.get("filter"),
                filter_substrait=d.get("filter_substrait"),
                constants=dict(d.get("constants") or {}),
                principal=d.get("principal"),
                expires_at=float(d["exp"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidArgument(f"direct task is malformed: {e}") from e


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _private_key(ticket_key: bytes) -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    seed = hmac.new(ticket_key, b"harness direct-task signing key", hashlib.sha256).digest()
    return Ed25519PrivateKey.from_private_bytes(seed)


class DirectSigner:
    """Signs direct tasks (gateway side); ``public_key`` is what clients verify with."""

    def __init__(self, ticket_key: bytes, ttl_s: float = 3600.0) -> None:
        self._key = _private_key(ticket_key)
        self.ttl_s = ttl_s

    @property
    def public_key(self) -> str:
        from cryptography.hazmat.primitives import serialization

        raw = self._key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return _b64(raw)

    def sign(self, task: DirectTask, *, now: float | None = None) -> str:
        task = replace(task, expires_at=(time.time() if now is None else now) + self.ttl_s)
        body = _b64(json.dumps(task.to_json(), separators=(",", ":"), sort_keys=True).encode())
        signed = DIRECT_PREFIX + body
        return f"{signed}.{_b64(self._key.sign(signed.encode()))}"


def verify_direct(token: str, public_key: str, *, now: float | None = None) -> DirectTask:
    """The task a token carries, after checking its signature and expiry (INVALID_ARGUMENT)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not isinstance(token, str) or not token.startswith(DIRECT_PREFIX) or token.count(".") != 2:
        raise InvalidArgument("direct task is malformed or of an unknown version")
    signed, _, sig = token.rpartition(".")
    try:
        Ed25519PublicKey.from_public_bytes(_unb64(public_key)).verify(_unb64(sig), signed.encode())
        raw = json.loads(_unb64(signed[len(DIRECT_PREFIX) :]))
    except (InvalidSignature, ValueError) as e:
        raise InvalidArgument(
            "direct task signature is invalid (tampered, or another gateway's)"
        ) from e
    task = DirectTask.from_json(raw)
    if (time.time() if now is None else now) > task.expires_at:
        raise InvalidArgument("direct task has expired; plan the read again")
    return task
