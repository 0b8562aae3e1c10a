"""Statement time limits share one thread: each call is made once, when due, in order; a
cancelled one never; cancelled ones do not pile up; a failing call does not stop the others."""

from __future__ import annotations

import threading
import time

from flight_gateway.faces.flightsql.deadlines import Deadlines


def test_calls_are_made_when_due_in_order_and_cancelled_ones_never() -> None:
    deadlines = Deadlines()
    made: list[tuple[str, float]] = []
    done = threading.Event()
    start = time.monotonic()

    def call(name: str) -> None:
        made.append((name, time.monotonic() - start))
        if name == "last":
            done.set()

    deadlines.after(0.3, lambda: call("last"))
    deadlines.after(0.1, lambda: call("first"))
    cancelled = deadlines.after(0.05, lambda: call("cancelled"))
    deadlines.after(0.2, lambda: 1 / 0)  # fails: logged, the next still made
    deadlines.cancel(cancelled)
    deadlines.cancel(cancelled)  # twice: nothing more
    assert done.wait(10)
    assert [name for name, _ in made] == ["first", "last"]
    assert made[0][1] >= 0.1 and made[1][1] >= 0.3
    assert deadlines.pending() == 0


def test_a_sooner_call_wakes_the_thread_waiting_for_a_later_one() -> None:
    deadlines = Deadlines()
    deadlines.after(60, lambda: None)
    time.sleep(0.05)  # the thread now waits a minute
    soon = threading.Event()
    start = time.monotonic()
    deadlines.after(0.05, soon.set)
    assert soon.wait(10)
    assert time.monotonic() - start < 5


def test_cancelled_calls_do_not_pile_up() -> None:
    deadlines = Deadlines()
    for _ in range(5000):  # statements that end long before their limit
        deadlines.cancel(deadlines.after(300, lambda: None))
    assert deadlines.pending() <= 2100
