"""Statements started at GetFlightInfo, streamed at DoGet.

A Flight SQL client asks GetFlightInfo and then, at once, DoGet of its ticket: two round
trips, and the statement ran only after the second arrived. Measured on a tiny statement
(``SELECT count(*)`` over 1,000 rows through ADBC, 4.4 ms in all), DoGet arrived ~0.5 ms after
GetFlightInfo returned and its worker needed ~1 ms more before the first batch. Now
GetFlightInfo, once it has typed the statement, lends it an idle worker that starts it; the
DoGet of its ticket on this gateway takes that running statement over (its result and slots).
ADBC prepares each new statement first (CreatePreparedStatement, GetFlightInfo, DoGet): there a
statement without parameters starts at CreatePreparedStatement, and its GetFlightInfo finds it
started when it pins the same versions.

A statement not typed before is started first and its FlightInfo carries the schema its result
begins with (``service.EARLY_SCHEMA_WAIT_S``): typing it apart bound it a second time.

Nothing in the contract changes: a ticket is still a sealed handle any replica runs from
scratch. A statement started early that no DoGet takes within ``limits.sql_early_start_s`` is
stopped and forgotten (its slots and worker given back); so is one whose statement is
cancelled, whose slots another statement needs, or whose caller has ``PER_PRINCIPAL`` newer
ones waiting. It is only ever started when a worker is idle and the caller's
slots are free at that moment: it never makes another call wait or fail.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from flight_gateway.core.metrics import SQL_EARLY
from flight_gateway.faces.flightsql.deadlines import Deadline, Deadlines
from flight_gateway.faces.flightsql.workers import Execution

#: Statements started early end here when no DoGet took them (not the statements' own
#: deadlines: an abandoned one must not delay those).
_EXPIRY = Deadlines("sql-early-expiry")


@dataclass
class Started:
    """A statement started at GetFlightInfo: its execution, and what its DoGet needs."""

    key: Hashable  # the statement and its pins (``service.early_key``), not its sealed ticket
    who: str
    execution: Execution
    release: Callable[[], None]  # its slots
    kept_as: tuple[Any, ...] | None  # where its result is kept, when it may be
    expiry: Deadline | None = None


#: Statements one principal may have started early and not taken yet; a further one stops the
#: oldest (a service account often stands for many users at once).
PER_PRINCIPAL = 4


class EarlyStarts:
    """The statements started early and not taken yet, at most ``PER_PRINCIPAL`` each."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._by_key: dict[Hashable, Started] = {}  # oldest first
        #: Statements started early, taken by their DoGet, and stopped untaken.
        self.counts = {"started": 0, "taken": 0, "abandoned": 0}

    @property
    def enabled(self) -> bool:
        return self.wait_s > 0

    def add(self, started: Started) -> None:
        """Hold ``started`` for its DoGet (its principal's oldest is stopped past
        ``PER_PRINCIPAL``)."""
        with self._lock:
            old = self._pop(started.key)  # the same statement, started twice: the later one
            mine = [k for k, s in self._by_key.items() if s.who == started.who]
            if old is None and len(mine) >= PER_PRINCIPAL:
                old = self._pop(mine[0])
            self._by_key[started.key] = started
            self._count("started")
            self._arm(started)
        if old is not None:
            self._abandon(old)

    def answering(self, started: Started) -> None:
        """``started``'s FlightInfo is being made (it waits for its schema): no expiry until
        ``answered``, which its caller must call, or else ``abandon`` it."""
        with self._lock:
            if self._by_key.get(started.key) is started and started.expiry is not None:
                _EXPIRY.cancel(started.expiry)
                started.expiry = None

    def answered(self, started: Started) -> None:
        """``started``'s FlightInfo is on its way to its caller, who can send its DoGet only
        now: its ``wait_s`` counts from here (a new statement's FlightInfo may have waited for
        its schema, ``service.EARLY_SCHEMA_WAIT_S``)."""
        with self._lock:
            if self._by_key.get(started.key) is not started:
                return  # taken, or stopped already
            if started.expiry is not None:
                _EXPIRY.cancel(started.expiry)
            self._arm(started)

    def _arm(self, started: Started) -> None:
        """``started`` expires ``wait_s`` from now; under the lock, so that whoever pops it
        next finds its expiry, to cancel."""
        started.expiry = _EXPIRY.after(self.wait_s, lambda: self._expire(started))

    def holds(self, key: Hashable, who: str) -> bool:
        with self._lock:
            started = self._by_key.get(key)
            return started is not None and started.who == who

    def take(self, key: Hashable, who: str) -> Started | None:
        """The statement of ``key`` started early for ``who``, now the caller's."""
        with self._lock:
            started = self._by_key.get(key)
            if started is None or started.who != who:
                return None
            self._pop(key)
            self._count("taken")
        if started.expiry is not None:
            _EXPIRY.cancel(started.expiry)
        return started

    def abandon(self, key: Hashable) -> None:
        with self._lock:
            started = self._pop(key)
        if started is not None:
            self._abandon(started)

    def _expire(self, started: Started) -> None:
        """``started`` if it still waits (not a later start of the same statement)."""
        with self._lock:
            if self._by_key.get(started.key) is not started:
                return
            self._pop(started.key)
        self._abandon(started)

    def abandon_oldest(self) -> bool:
        """Stop the statement started early longest ago (another statement needs its slots);
        whether there was one."""
        with self._lock:
            started = self._pop(next(iter(self._by_key), None))
        if started is None:
            return False
        self._abandon(started)
        return True

    def abandon_all(self) -> None:
        """Stop every statement started early (the gateway closes)."""
        with self._lock:
            all_ = [self._pop(k) for k in list(self._by_key)]
        for started in all_:
            if started is not None:
                self._abandon(started)

    def waiting(self) -> int:
        with self._lock:
            return len(self._by_key)

    def _pop(self, key: Hashable | None) -> Started | None:
        return self._by_key.pop(key, None) if key is not None else None

    def _count(self, outcome: str) -> None:
        self.counts[outcome] += 1
        SQL_EARLY.labels(outcome).inc()

    def _abandon(self, started: Started) -> None:
        """Give the slots back at once (the caller of ``abandon_oldest`` takes them next); stop
        the statement and give its worker back off the caller's path (that waits for its
        answer)."""
        with self._lock:
            self._count("abandoned")
        if started.expiry is not None:
            _EXPIRY.cancel(started.expiry)
        started.release()
        threading.Thread(
            target=started.execution.abandon, daemon=True, name="sql-early-abandon"
        ).start()
