"""``Slots``: a call over a limit fails at once, or after waiting up to the ``wait_s`` its slots
were made with for a place to free (real threads, no clock faked)."""

from __future__ import annotations

import threading
import time

import pytest

from flight_gateway.core.slots import Slots
from flight_gateway.protocol.errors import Busy


def _held_for(slots: Slots, name: str, seconds: float) -> threading.Thread:
    """A call of ``name`` holding a place for ``seconds`` (started, its place taken)."""
    taken = threading.Event()

    def hold() -> None:
        with slots.hold(name):
            taken.set()
            time.sleep(seconds)

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(5)
    return thread


def test_without_a_wait_a_call_over_the_limit_fails_at_once() -> None:
    slots = Slots(1, "max_x_per_principal")
    holder = _held_for(slots, "alice", 1.0)
    started = time.monotonic()
    with pytest.raises(Busy, match="max_x_per_principal"):
        slots.acquire("alice")
    assert time.monotonic() - started < 0.5
    slots.acquire("bob")  # another principal's place is its own
    slots.release("bob")
    holder.join()


def test_a_call_over_the_limit_takes_the_place_freed_while_it_waits() -> None:
    slots = Slots(1, "max_x_per_principal", wait_s=5.0)
    holder = _held_for(slots, "alice", 0.3)
    started = time.monotonic()
    with slots.hold("alice"):
        waited = time.monotonic() - started
        assert slots.in_progress("alice") == 1
    assert 0.1 < waited < 4.0
    holder.join()
    assert slots.in_progress() == 0


def test_a_wait_that_sees_no_place_free_fails_after_wait_s() -> None:
    slots = Slots(2, "max_x_per_principal", total=2, total_limit="max_x", wait_s=0.3)
    holders = [_held_for(slots, "alice", 2.0), _held_for(slots, "bob", 2.0)]
    started = time.monotonic()
    with pytest.raises(Busy, match="max_x"):
        slots.acquire("carol")  # the gateway-wide limit is full
    assert 0.25 < time.monotonic() - started < 1.5
    for h in holders:
        h.join()
    assert slots.in_progress() == 0
