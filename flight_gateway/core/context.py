"""What every handler needs: the catalog and the operator's policies."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from flight_gateway.catalog import Catalog
from flight_gateway.core.config import Limits
from flight_gateway.core.reach import ReachPolicy
from flight_gateway.core.secrets import SecretResolver
from flight_gateway.core.snapshots import Snapshots
from flight_gateway.core.source_defs import SourceDefCache


@dataclass
class Gateway:
    catalog: Catalog
    secrets: SecretResolver = field(default_factory=SecretResolver)
    reach: ReachPolicy = field(default_factory=lambda: ReachPolicy(any=True))
    limits: Limits = field(default_factory=Limits)
    #: Signs what writes leave in sources to find again (``AppendContext.tag_key``); replicas
    #: derive it from the shared ticket key.
    tag_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    source_defs: SourceDefCache = field(init=False)
    #: Table versions described once, for reads and writes alike.
    snapshots: Snapshots = field(init=False)

    def __post_init__(self) -> None:
        self.source_defs = SourceDefCache(self.catalog)
        self.snapshots = Snapshots(self.catalog)

    def tag_key(self, table_id: int, source: str) -> bytes:
        """The write-tag key of one source of one table incarnation."""
        message = f"write-tags\0{table_id}\0{source}".encode()
        return hmac.new(self.tag_secret, message, hashlib.sha256).digest()
