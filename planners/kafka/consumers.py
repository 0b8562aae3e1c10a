"""A process-wide bound on open Kafka consumers.

What many concurrent Kafka reads cost a gateway is mostly the consumers themselves: each has its
own librdkafka threads, fetch buffers and prefetch queue. 64 reads of one 60,000-message
partition at once took a test process from 180 MB to 0.7-1.2 GB resident, growing from round to
round; the same reads with at most 4 consumers open stayed at 310-330 MB and finished sooner
(6.7-8.4 s a round against 12-14 s on 2 cores), docs/operations.md.

A read *leases* a consumer: it waits for one of ``limit`` permits (up to ``wait_s``; then
``Busy``, nothing was read), opens its consumer and keeps it while it reads. Between chunks,
while its caller decodes and streams what it got, the lease is *parked*: a client that stops
reading must not hold a permit for as long as its stream stays open, so a waiter takes the
permit of a lease parked longer than ``park_s``, closing that consumer. The parked read opens a
new one at its next offset when it resumes (waiting for a permit like anyone else).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from flight_gateway.protocol.errors import Busy, ResourceExhausted

log = logging.getLogger(__name__)


#: How long a read waits for a consumer before it is refused (``limits.kinds.kafka.consumer_wait_s``).
WAIT_S = 60.0


def default_limit() -> int:
    """Two consumers per core, at least 4 (best on 2 cores: the Kafka figures above)."""
    return max(4, 2 * (os.cpu_count() or 1))


class Lease:
    """One read's claim on a consumer; ``get(offset)`` returns it, reopened at ``offset`` if a
    waiter took it while the read was parked."""

    def __init__(self, pool: ConsumerPool, open_at: Callable[[int], Any], what: str) -> None:
        self._pool = pool
        self._open_at = open_at
        self.what = what
        self.consumer: Any = None
        self.evictions = 0

    def get(self, offset: int) -> Any:
        if self.consumer is None:
            self._pool.acquire(self, first=self.evictions == 0)
            try:
                self.consumer = self._open_at(offset)
            except BaseException:
                self._pool.release()
                raise
        return self.consumer

    @contextlib.contextmanager
    def parked(self) -> Iterator[None]:
        """While the read's caller has control (decoding, streaming): a waiter may take the
        consumer once it has been parked ``park_s``."""
        self._pool.park(self)
        try:
            yield
        finally:
            self._pool.unpark(self)


class ConsumerPool:
    def __init__(self, limit: int = 0, wait_s: float = WAIT_S, park_s: float = 1.0) -> None:
        self.limit = limit or default_limit()
        self.wait_s, self.park_s = wait_s, park_s
        self._cond = threading.Condition()
        self._held = 0
        self._parked: dict[Lease, float] = {}

    def configure(self, limit: int = 0, wait_s: float = WAIT_S) -> None:
        """The gateway's ``limits.kinds.kafka``: ``max_consumers`` (0: ``default_limit()``) and
        ``consumer_wait_s``."""
        with self._cond:
            self.limit = limit or default_limit()
            self.wait_s = wait_s
            self._cond.notify_all()

    def open_count(self) -> int:
        with self._cond:
            return self._held

    @contextlib.contextmanager
    def lease(self, open_at: Callable[[int], Any], what: str) -> Iterator[Lease]:
        """A lease whose consumer ``open_at(offset)`` opens on first ``get``; closed (and its
        permit given back) when the block ends."""
        lease = Lease(self, open_at, what)
        try:
            yield lease
        finally:
            with self._cond:
                self._parked.pop(lease, None)
                consumer, lease.consumer = lease.consumer, None
            if consumer is not None:
                _close(consumer)
                self.release()

    def acquire(self, lease: Lease, first: bool) -> None:
        deadline = time.monotonic() + self.wait_s
        victim = None
        with self._cond:
            while self._held >= self.limit:
                victim = self._stale_parked()
                if victim is not None:
                    # The permit passes from the victim to this lease (no count changes); its
                    # consumer is closed below, before this lease opens its own.
                    stolen, victim.consumer = victim.consumer, None
                    victim.evictions += 1
                    del self._parked[victim]
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._refusal(lease, first)
                self._cond.wait(min(left, self._until_stale()))
            else:
                self._held += 1
        if victim is not None:
            log.info("kafka: %s parked over %.1fs, consumer closed", victim.what, self.park_s)
            _close(stolen)

    def release(self) -> None:
        with self._cond:
            self._held -= 1
            self._cond.notify()

    def park(self, lease: Lease) -> None:
        with self._cond:
            if lease.consumer is not None:
                self._parked[lease] = time.monotonic()
                if self._held >= self.limit:
                    self._cond.notify()  # a waiter may take it once it is stale

    def unpark(self, lease: Lease) -> None:
        with self._cond:
            self._parked.pop(lease, None)

    def _stale_parked(self) -> Lease | None:
        now = time.monotonic()
        stale = [(t, id(x), x) for x, t in self._parked.items() if now - t >= self.park_s]
        return min(stale)[2] if stale else None

    def _until_stale(self) -> float:
        if not self._parked:
            return self.park_s
        oldest = min(self._parked.values())
        return max(0.01, oldest + self.park_s - time.monotonic())

    def _refusal(self, lease: Lease, first: bool) -> ResourceExhausted:
        where = f"all {self.limit} Kafka consumers of the gateway are in use"
        hint = "(limits.kinds.kafka: max_consumers, consumer_wait_s)"
        if first:  # nothing read yet: the same call succeeds later
            return Busy(f"{lease.what}: {where} for {self.wait_s:g}s {hint}; retry later")
        return ResourceExhausted(
            f"{lease.what}: its consumer was handed to another read while this stream's client "
            f"was not reading, and {where} for {self.wait_s:g}s since {hint}"
        )


def _close(consumer: Any) -> None:
    try:
        consumer.close()
    except Exception as e:  # a consumer that cannot close cleanly is gone all the same
        log.debug("kafka consumer close: %s", e)


#: The process's pool; the gateway configures it from its ``limits`` at start.
POOL = ConsumerPool()
