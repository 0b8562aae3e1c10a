"""``HarnessClient``: a gateway's client in one object: reads as Arrow with pandas, Polars and
DuckDB adapters and SQL (``reads``), writes and typed action wrappers (``admin``), over
connections with failover (``transport``). It imports the gateway's vocabulary only
(``flight_gateway.protocol``): a pandas user installs no server."""

from __future__ import annotations

from clients.admin import Admin, HeldLock
from clients.reads import Reads

__all__ = ["HarnessClient", "HeldLock"]


class HarnessClient(Reads, Admin):
    """Client of one gateway (``grpc://host:port``); endpoints on other replicas are followed.
    ``HarnessClient(uri, token=..., replicas=[...])``: see ``Transport.__init__``."""

    def __enter__(self) -> HarnessClient:
        return self
