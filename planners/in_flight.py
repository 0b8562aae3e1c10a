"""Work on a key done by one caller at a time (``InFlight``): for per-process caches of
immutable things (decoded files, manifest entries), which a process new to a table would
otherwise fill once per reader when many arrive at once (a replica restarted under failover
gets every reader together)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


class InFlight:
    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s  # how long a caller waits for another before it does the work
        self._lock = threading.Lock()
        self._events: dict[Hashable, threading.Event] = {}

    def get(self, key: Hashable, cached: Callable[[], T | None], make: Callable[[], T]) -> T:
        """``cached()``, else ``make()`` (which keeps what it makes where ``cached`` finds it):
        made by one caller per key at a time, the others waiting for it and then asking
        ``cached`` again; when that finds nothing (it failed, or kept nothing) each makes it."""
        hit = cached()
        if hit is not None:
            return hit
        with self._lock:
            event = self._events.get(key)
            mine = event is None
            if event is None:
                event = self._events[key] = threading.Event()
        if not mine:
            event.wait(self.wait_s)
            hit = cached()
            return hit if hit is not None else make()
        try:
            return make()
        finally:
            with self._lock:
                self._events.pop(key, None)
            event.set()
