"""What every handler needs: the catalog and the operator's policies."""

from __future__ import annotations

from dataclasses import dataclass, field

from flight_gateway.catalog import Catalog
from flight_gateway.secrets import SecretResolver
from flight_gateway.server.config import Limits
from flight_gateway.server.reach import ReachPolicy
from flight_gateway.server.source_defs import SourceDefCache


@dataclass
class Gateway:
    catalog: Catalog
    secrets: SecretResolver = field(default_factory=SecretResolver)
    reach: ReachPolicy = field(default_factory=lambda: ReachPolicy(any=True))
    limits: Limits = field(default_factory=Limits)
    source_defs: SourceDefCache = field(init=False)

    def __post_init__(self) -> None:
        self.source_defs = SourceDefCache(self.catalog)
