"""The client's failover window (clients.failover.Replicas) counts from the first failure, so a
long call cut when its replica dies is sent again however long it ran."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import pyarrow.flight as fl
import pytest

from clients.failover import Replicas

CUT = "Flight returned unavailable error, with message: Stream removed (Socket closed)"
REFUSED = "Flight returned unavailable error, with message: failed to connect to all addresses"


def test_a_long_call_cut_by_a_dying_replica_is_sent_again() -> None:
    replicas = Replicas(["grpc://a:1", "grpc://b:1"], window_s=0.2)
    calls: list[str] = []

    def call(uri: str) -> str:
        calls.append(uri)
        if len(calls) == 1:
            time.sleep(0.3)  # ran longer than the whole window, then its replica died
            raise fl.FlightUnavailableError(CUT)
        return uri

    assert replicas.run(call) == "grpc://b:1"
    assert calls == ["grpc://a:1", "grpc://b:1"]


def test_failures_stop_once_the_window_after_the_first_has_passed() -> None:
    replicas = Replicas(["grpc://a:1", "grpc://b:1"], window_s=0.3)
    calls: list[float] = []

    def call(uri: str) -> str:
        calls.append(time.monotonic())
        raise fl.FlightUnavailableError(REFUSED)

    with pytest.raises(fl.FlightUnavailableError):
        replicas.run(call)
    assert len(calls) > 2 and 0.3 <= calls[-1] - calls[0] < 2.0


def test_without_a_window_the_first_failure_is_raised() -> None:
    replicas = Replicas(["grpc://a:1"], window_s=0.0)
    calls: list[str] = []

    def call(uri: str) -> str:
        calls.append(uri)
        raise fl.FlightUnavailableError(CUT)

    with pytest.raises(fl.FlightUnavailableError):
        replicas.run(call)
    assert calls == ["grpc://a:1"]


def test_a_call_cut_again_after_it_was_served_gets_a_new_window() -> None:
    """A long read cut each time its replica dies (replicas killed more often than the read
    takes) is sent again as long as a replica served it for a while before each cut: the window
    bounds the time no replica answers, not the read's length."""
    replicas = Replicas(["grpc://a:1", "grpc://b:1"], window_s=0.3, served_s=0.1)
    calls: list[str] = []

    def call(uri: str) -> str:
        calls.append(uri)
        if len(calls) <= 3:
            time.sleep(0.25)  # served for a while, then its replica died
            raise fl.FlightUnavailableError(CUT)
        return uri

    assert replicas.run(call) == "grpc://b:1"
    assert len(calls) == 4


def test_cuts_renew_the_window_a_bounded_number_of_times() -> None:
    """A call that every replica it reaches dies under is not sent again for ever."""
    replicas = Replicas(["grpc://a:1", "grpc://b:1"], window_s=0.05, served_s=0.01, renewals=3)
    calls: list[str] = []

    def call(uri: str) -> str:
        calls.append(uri)
        time.sleep(0.03)
        raise fl.FlightUnavailableError(CUT)

    with pytest.raises(fl.FlightUnavailableError):
        replicas.run(call)
    assert 4 <= len(calls) <= 8


A, B = "grpc://a:1", "grpc://b:1"


def _calls(down: set[str], log: list[str]) -> Callable[[str], str]:
    def call(uri: str) -> str:
        log.append(uri)
        if uri in down:
            raise fl.FlightUnavailableError(REFUSED)
        return uri

    return call


def test_a_client_goes_back_to_its_first_replica_once_it_answers() -> None:
    """Clients spread over replicas stay spread after a restart: a client moved off its first
    replica tries it again after ``failback_s`` and stays once it answers."""
    replicas = Replicas([A, B], window_s=5.0, failback_s=0.2)
    down, calls = {A}, list[str]()
    call = _calls(down, calls)
    assert replicas.run(call) == B
    assert replicas.run(call) == B  # not due yet: the first replica is not tried
    assert calls == [A, B, B]
    down.clear()  # restarted
    time.sleep(0.25)
    assert replicas.run(call) == A
    assert replicas.run(call) == A
    assert calls[3:] == [A, A]


def _tries_of_the_first(replicas: Replicas, error: str, seconds: float) -> list[float]:
    """When the first replica, failing each time with ``error``, was tried while calls ran
    one after another for ``seconds`` (each answered by the second)."""
    tries: list[float] = []

    def call(uri: str) -> str:
        if uri == A:
            tries.append(time.monotonic())
            raise fl.FlightUnavailableError(error)
        return uri

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert replicas.run(call) == B
        time.sleep(0.005)
    return tries


def test_a_first_replica_that_stays_unreachable_is_tried_less_and_less_often() -> None:
    """A host that does not answer keeps each try waiting for its connect timeout."""
    replicas = Replicas([A, B], window_s=5.0, failback_s=0.05)
    tries = _tries_of_the_first(replicas, REFUSED, 1.0)
    # Due at 0.05, 0.15, 0.35 and 0.75 s after the first failure: not at each of ~150 calls.
    assert 3 <= len(tries) <= 6
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert all(later > earlier for earlier, later in itertools.pairwise(gaps))


def test_without_failback_a_client_stays_where_it_failed_over() -> None:
    replicas = Replicas([A, B], window_s=5.0, failback_s=None)
    down, calls = {A}, list[str]()
    call = _calls(down, calls)
    assert replicas.run(call) == B
    down.clear()
    time.sleep(0.05)
    assert [replicas.run(call) for _ in range(3)] == [B, B, B]


def test_a_first_replica_refusing_connections_is_tried_at_the_same_pace() -> None:
    """Its host answers at once, so a try costs nothing, and a replica restarting (killed
    every 20 s and back within 8-16 s in the failover bench) is used again within
    ``failback_s`` of its return: doubled pauses had clients miss it until its next kill."""
    replicas = Replicas([A, B], window_s=5.0, failback_s=0.1)
    refused = (
        "Flight returned unavailable error, with message: failed to connect to all addresses; "
        "last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: "
        "Connection refused"
    )
    tries = _tries_of_the_first(replicas, refused, 1.2)
    # Due every 0.1 s: ~12 tries (doubled pauses would make 4: at 0, 0.1, 0.3 and 0.7 s).
    assert 8 <= len(tries) <= 14
