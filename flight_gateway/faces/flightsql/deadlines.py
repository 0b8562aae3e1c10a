"""Statement time limits on one thread: a ``threading.Timer`` per statement started a thread on
each statement's path (Thread.start waits for the new thread to run: 0.5-0.9 ms of a tiny
statement's ~10 ms in the gateway, under load more), and almost every statement cancels it."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Deadline:
    """One scheduled call (``Deadlines.cancel`` makes it a no-op)."""

    __slots__ = ("at", "call")

    def __init__(self, at: float, call: Callable[[], None]) -> None:
        self.at = at
        self.call: Callable[[], None] | None = call


class Deadlines:
    """Calls each scheduled function on one daemon thread once its time has come. A call must
    not block: the ones due after it wait for it."""

    def __init__(self, name: str = "sql-deadlines") -> None:
        self.name = name
        self._cond = threading.Condition()
        self._queue: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._cancelled = 0

    def after(self, seconds: float, call: Callable[[], None]) -> Deadline:
        deadline = Deadline(time.monotonic() + seconds, call)
        with self._cond:
            heapq.heappush(self._queue, (deadline.at, next(self._order), deadline))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name=self.name)
                self._thread.start()
            elif self._queue[0][2] is deadline:  # sooner than what the thread waits for
                self._cond.notify()
        return deadline

    def cancel(self, deadline: Deadline) -> None:
        """The call will not be made. Cancelled calls leave the queue when due, or all at once
        when they are most of it (a statement's limit is minutes; most end in milliseconds)."""
        with self._cond:
            if deadline.call is None:
                return
            deadline.call = None
            self._cancelled += 1
            if self._cancelled > 1024 and self._cancelled * 2 > len(self._queue):
                self._queue = [e for e in self._queue if e[2].call is not None]
                heapq.heapify(self._queue)
                self._cancelled = 0

    def pending(self) -> int:
        """Scheduled calls not yet due, cancelled ones included (tests)."""
        with self._cond:
            return len(self._queue)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._queue and self._queue[0][2].call is None:
                    heapq.heappop(self._queue)  # cancelled: nothing to wait for
                    self._cancelled = max(0, self._cancelled - 1)
                if not self._queue:
                    self._cond.wait()
                    continue
                wait = self._queue[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                deadline = heapq.heappop(self._queue)[2]
                call, deadline.call = deadline.call, None
            if call is not None:
                try:
                    call()
                except Exception:  # one failing call must not stop the others' deadlines
                    log.exception("a scheduled call failed")
