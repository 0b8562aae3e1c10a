"""Failover between gateway replicas for calls that are safe to repeat.

Replicas share one catalog and one ticket key, so a plan, a ticket or a commit id means the
same thing on each. A call that failed because its replica is gone (connection refused or
reset, stream removed) is repeated on the next replica: planning and metadata reads as they
are, DoGet of a ticket from its start (the caller drops what the cut stream delivered), DoPut
and commits with their commit id (a repeat of one that landed answers ``applied: false``).
Calls that are not idempotent (taking a lock, creating a table) are never repeated.

A client that failed over goes back to its first replica once that one answers again
(``Replicas.failback_s``), so that clients spread over replicas stay spread after a restart.

A call a gateway refused because a concurrency limit was full (RESOURCE_EXHAUSTED of kind
``busy``: too many streams, uploads or statements in progress) did nothing, so any call is
repeated after a jittered back-off, for up to ``busy_s``: the gateway sheds load at once and
well-behaved clients come back later, as its limits documentation asks.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import pyarrow as pa
import pyarrow.flight as fl

from flight_gateway.protocol.actions import IDEMPOTENT
from flight_gateway.protocol.flight_errors import is_busy

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Actions a client may repeat on another replica: reads, and writes keyed by an id.
IDEMPOTENT_ACTIONS = IDEMPOTENT  # safe to repeat: protocol/actions.py says which


#: gRPC's words for a replica that cannot be reached or went away mid-call. A gateway's own
#: UNAVAILABLE (a source it cannot reach) has none of them and is not retried elsewhere.
_TRANSPORT = (
    "failed to connect",
    "connection refused",
    "connection reset",
    "stream removed",
    "socket closed",
    "broken pipe",
    "goaway",
    "end of tcp stream",
)


def is_transport_failure(exc: BaseException) -> bool:
    """The replica could not be reached or went away mid-call (not an answer it gave)."""
    if not isinstance(exc, (OSError, pa.ArrowException, fl.FlightError)):
        return False
    text = str(exc).lower()
    return "unavailable" in text and any(word in text for word in _TRANSPORT)


def never_sent(exc: BaseException) -> bool:
    """No connection was made, so the gateway never saw the call: safe to send elsewhere."""
    return refused(exc) or (is_transport_failure(exc) and "failed to connect" in str(exc).lower())


def refused(exc: BaseException) -> bool:
    """The replica's host answered at once that nothing listens there (a gateway restarting),
    not a host that does not answer at all."""
    return is_transport_failure(exc) and "refused" in str(exc).lower()


#: The longest pause between a client's tries of its first replica while that one stays down.
FAILBACK_MAX_S = 60.0


class Replicas:
    """The gateway addresses a client may use, the first one preferred: after a failure
    moved the client off it, it is tried again (``failback_s``)."""

    def __init__(
        self,
        uris: Sequence[str],
        window_s: float,
        busy_s: float = 0.0,
        served_s: float = 1.0,
        renewals: int = 10,
        failback_s: float | None = 5.0,
    ) -> None:
        if not uris:
            raise ValueError("at least one gateway address is needed")
        self.uris = list(dict.fromkeys(uris))
        self.window_s = window_s  # how long to keep trying across replicas
        self.busy_s = busy_s  # how long to keep retrying a call refused as busy
        #: A call cut after a replica served it this long starts the window again, at most
        #: ``renewals`` times: a replica was up meanwhile, and under rolling restarts or a
        #: replica killed every 20 s a read longer than that was cut on each replica it
        #: reached and given up (the failover bench: 5-11 reads a run).
        self.served_s, self.renewals = served_s, renewals
        #: ``failback_s`` after a failure moved the client off its first replica, a call
        #: tries that one first again, and stays there if it answers; while it does not, the
        #: next try is ``failback_s`` later again if it refused the connection, else after a
        #: pause that doubles (at most ``FAILBACK_MAX_S``); None: never. Without it, clients that
        #: failed over stayed where they landed, so after a restart one replica served them
        #: all and the other none: the next failure moved every client at once onto a
        #: replica whose caches were cold (the failover bench: no read ended for the 8-12 s
        #: after each kill).
        self.failback_s = failback_s
        self._back_at: float | None = None  # when the first replica is tried again
        self._back_pause = failback_s or 0.0
        self._current = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> str:
        return self.uris[self._current]

    def _next_after(self, failed: str, refused: bool = False) -> None:
        """Move off ``failed``; when it is the first replica, plan when to try it again:
        ``failback_s`` later if it ``refused`` the connection (its host answers at once:
        trying again costs nothing, and a replica restarting is back within seconds), else
        after a pause that doubles with each failed try (a host that does not answer keeps
        the call waiting for its connect timeout)."""
        with self._lock:
            if self.uris[self._current] == failed:
                self._current = (self._current + 1) % len(self.uris)
            if failed != self.uris[0] or self._current == 0 or self.failback_s is None:
                return
            now = time.monotonic()
            if self._back_at is None:  # just moved off it
                self._back_at = now + self._back_pause
            elif now >= self._back_at:  # the try it was due failed
                if not refused:
                    self._back_pause = min(self._back_pause * 2, FAILBACK_MAX_S)
                self._back_at = now + self._back_pause

    def _failback(self) -> list[str]:
        """The first replica when it is time to try it again, else nothing."""
        with self._lock:
            due = self._back_at is not None and time.monotonic() >= self._back_at
            return [self.uris[0]] if due and self._current != 0 else []

    def _answered(self, uri: str) -> None:
        """``uri`` answered a call: back on the first replica if it is that one."""
        if uri != self.uris[0] or self._current == 0:
            return
        with self._lock:
            self._current, self._back_at = 0, None
            self._back_pause = self.failback_s or 0.0

    def run(
        self, call: Callable[[str], T], prefer: Sequence[str] = (), *, unsent_only: bool = False
    ) -> T:
        """``call(uri)`` on ``prefer`` then the replicas, moving on after transport failures,
        for up to ``window_s`` after the first one (a replica that restarts meanwhile is tried
        again): a long read cut when its replica died is sent again however long it ran (from
        the call's start, a read that took longer than the window was never repeated: the
        failover bench lost reads that way), and a call cut after a replica served it for
        ``served_s`` has the window again (``renewals`` times). With ``unsent_only`` (a call
        that is not safe to repeat) only after failures to connect."""
        retryable = never_sent if unsent_only else is_transport_failure
        deadline: float | None = None
        renewed = 0
        busy_until = time.monotonic() + self.busy_s
        pause, busy_pause = 0.05, 0.02
        while True:
            order = list(dict.fromkeys([*prefer, *self._failback(), self.current, *self.uris]))
            busy = False
            for uri in order:
                began = time.monotonic()
                try:
                    out = call(uri)
                except Exception as e:
                    if is_busy(e) and time.monotonic() < busy_until:
                        busy = True
                        break
                    now = time.monotonic()
                    served = now - began >= self.served_s and not never_sent(e)
                    if deadline is None:
                        deadline = now + self.window_s
                    elif served and renewed < self.renewals and retryable(e):
                        deadline, renewed = now + self.window_s, renewed + 1
                    if not retryable(e) or now >= deadline:
                        raise
                    log.info("gateway %s unreachable (%s); trying another replica", uri, e)
                    if uri in self.uris:
                        self._next_after(uri, refused(e))
                    continue
                self._answered(uri)
                return out
            if busy:  # jittered, so that refused callers do not all come back at once
                time.sleep(busy_pause * random.uniform(0.5, 1.5))
                busy_pause = min(busy_pause * 2, 1.0)
                continue
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
