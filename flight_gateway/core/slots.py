"""Bounded slots for calls in progress (DoGet streams, SQL statements, DoPut uploads), per
principal and optionally gateway-wide. Over a limit a call fails at once with RESOURCE_EXHAUSTED
naming the limit (kind ``busy`` in its details: nothing was done, so a retry later is safe).
A caller that may wait for a place (the Iceberg REST face) looks again with ``try_acquire`` on
its own event loop: a wait here would hold the caller's thread."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from flight_gateway.protocol.errors import Busy


class Slots:
    def __init__(
        self,
        per_principal: int,
        per_principal_limit: str,
        total: int | None = None,
        total_limit: str = "",
        what: str = "calls",
    ) -> None:
        self.per_principal, self.total = per_principal, total
        self._names = (per_principal_limit, total_limit)
        self._what = what
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def in_progress(self, name: str | None = None) -> int:
        with self._lock:
            return sum(self._open.values()) if name is None else self._open.get(name, 0)

    def acquire(self, name: str) -> None:
        with self._lock:
            full = self._full(name)
            if full is not None:
                raise Busy(full)
            self._open[name] = self._open.get(name, 0) + 1

    def try_acquire(self, name: str) -> bool:
        """Take a place for ``name`` if one is free now (never waits)."""
        with self._lock:
            if self._full(name) is not None:
                return False
            self._open[name] = self._open.get(name, 0) + 1
            return True

    def why_full(self, name: str) -> str:
        """Why ``name`` may not start a call now (for its refusal)."""
        with self._lock:
            return self._full(name) or "a place was free again"

    def _full(self, name: str) -> str | None:
        """Why ``name`` may not start a call now (the lock held), or None."""
        if self._open.get(name, 0) >= self.per_principal:
            return (
                f"{name!r} has {self.per_principal} {self._what} in progress "
                f"(limits.{self._names[0]}); retry when one has finished"
            )
        if self.total is not None and sum(self._open.values()) >= self.total:
            return (
                f"the gateway has {self.total} {self._what} in progress "
                f"(limits.{self._names[1]}); retry later"
            )
        return None

    def release(self, name: str) -> None:
        with self._lock:
            left = self._open.get(name, 0) - 1
            if left > 0:
                self._open[name] = left
            else:
                self._open.pop(name, None)

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[None]:
        self.acquire(name)
        try:
            yield
        finally:
            self.release(name)
