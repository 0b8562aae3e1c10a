"""``Slots``: a call over a limit fails at once, naming the limit; a caller that may wait looks
again with ``try_acquire`` (the Iceberg REST face, on its event loop)."""

from __future__ import annotations

import pytest

from flight_gateway.core.slots import Slots
from flight_gateway.protocol.errors import Busy


def test_a_call_over_the_limit_fails_at_once_naming_it() -> None:
    slots = Slots(1, "max_x_per_principal")
    slots.acquire("alice")
    with pytest.raises(Busy, match="max_x_per_principal"):
        slots.acquire("alice")
    slots.acquire("bob")  # another principal's place is its own
    slots.release("bob")
    slots.release("alice")
    assert slots.in_progress() == 0


def test_try_acquire_takes_a_place_only_when_one_is_free() -> None:
    slots = Slots(2, "max_x_per_principal", total=2, total_limit="max_x")
    assert slots.try_acquire("alice") and slots.try_acquire("bob")
    assert not slots.try_acquire("carol")  # the gateway-wide limit is full
    assert "max_x" in slots.why_full("carol")
    assert slots.in_progress() == 2
    slots.release("bob")
    assert slots.try_acquire("carol")
    assert not slots.try_acquire("alice")  # full again: alice and carol
