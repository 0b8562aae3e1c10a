"""Python client of the harness gateway. Knows the wire protocol only."""

from clients.client import HarnessClient, HeldLock

__all__ = ["HarnessClient", "HeldLock"]
