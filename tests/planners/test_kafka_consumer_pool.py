"""The consumer pool's rules on their own (``planners.kafka.consumers``); the same rules against
the real broker and gateway: tests/gateway/test_kafka_consumers.py."""

from __future__ import annotations

import threading
import time

import pytest

from flight_gateway.protocol.errors import Busy, ResourceExhausted
from planners.kafka.consumers import ConsumerPool


class Handle:
    """What a lease opens: records the offset it was opened at and whether it was closed."""

    def __init__(self, offset: int) -> None:
        self.offset, self.closed = offset, False

    def close(self) -> None:
        self.closed = True


def test_a_lease_opens_lazily_and_gives_its_permit_back() -> None:
    pool = ConsumerPool(limit=1, wait_s=0.2)
    with pool.lease(Handle, "a") as a:
        assert pool.open_count() == 0
        h = a.get(5)
        assert (h.offset, pool.open_count()) == (5, 1)
        assert a.get(9) is h  # kept while the lease lasts
    assert h.closed and pool.open_count() == 0


def test_waiting_past_the_bound_is_busy_when_nothing_was_read() -> None:
    pool = ConsumerPool(limit=1, wait_s=0.2)
    with pool.lease(Handle, "a") as a:
        a.get(0)
        with pool.lease(Handle, "b") as b, pytest.raises(Busy, match="b: all 1 Kafka consumers"):
            b.get(0)
    assert pool.open_count() == 0


def test_a_waiter_takes_the_consumer_of_a_lease_parked_too_long() -> None:
    pool = ConsumerPool(limit=1, wait_s=5, park_s=0.1)
    with pool.lease(Handle, "slow") as slow:
        first = slow.get(0)
        with slow.parked():
            t0 = time.monotonic()
            with pool.lease(Handle, "fast") as fast:
                assert fast.get(7).offset == 7
                assert first.closed and slow.consumer is None
                assert time.monotonic() - t0 >= 0.1  # not before it was parked park_s
        again = slow.get(42)  # reopened at its next offset, with a permit of its own
        assert again is not first and again.offset == 42 and pool.open_count() == 1
    assert pool.open_count() == 0


def test_a_lease_that_lost_its_consumer_and_cannot_get_one_back_is_not_busy() -> None:
    """It had read rows already: a retry of the call is not the same as a call that did
    nothing, so the refusal is a plain RESOURCE_EXHAUSTED."""
    pool = ConsumerPool(limit=1, wait_s=0.3, park_s=0.05)
    with pool.lease(Handle, "slow") as slow:
        slow.get(0)
        with slow.parked(), pool.lease(Handle, "fast") as fast:
            fast.get(0)
        with pool.lease(Handle, "other") as other:
            other.get(0)
            with pytest.raises(ResourceExhausted, match="handed to another read") as err:
                slow.get(10)
            assert not isinstance(err.value, Busy)


def test_a_lease_in_use_is_never_taken() -> None:
    pool = ConsumerPool(limit=1, wait_s=0.3, park_s=0.01)
    with pool.lease(Handle, "busy") as held:
        h = held.get(0)
        with pool.lease(Handle, "b") as b, pytest.raises(Busy):
            b.get(0)
        assert not h.closed


def test_many_threads_never_exceed_the_limit() -> None:
    pool = ConsumerPool(limit=3, wait_s=10, park_s=0.01)
    open_now, peak, lock = [0], [0], threading.Lock()

    class Counted(Handle):
        def __init__(self, offset: int) -> None:
            super().__init__(offset)
            with lock:
                open_now[0] += 1
                peak[0] = max(peak[0], open_now[0])

        def close(self) -> None:
            with lock:
                open_now[0] -= 1

    def read() -> None:
        with pool.lease(Counted, "r") as lease:
            for i in range(20):
                lease.get(i)
                with lease.parked():
                    time.sleep(0.002)

    threads = [threading.Thread(target=read) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert peak[0] == 3 and open_now[0] == 0 and pool.open_count() == 0
