"""The client's failover window (clients.failover.Replicas) counts from the first failure, so a
long call cut when its replica dies is sent again however long it ran."""

from __future__ import annotations

import time

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
