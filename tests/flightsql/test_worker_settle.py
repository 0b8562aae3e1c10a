"""A statement that took a while has its answer sent before its database is closed (~5-10 ms,
freeing its memory): its caller does not wait for that, and the gateway lends the worker again
only once the worker says it has, checking then whether it grew."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from flight_gateway.faces.flightsql import worker as protocol
from flight_gateway.faces.flightsql.workers import Execution, Plan, WorkerLimits, WorkerPool

LONG = "SELECT sum(hash(range)) % 7 AS n FROM range(100000000)"  # well over 50 ms


@pytest.fixture
def pool(tmp_path: Path):
    limits = WorkerLimits(memory_limit_mb=256, duckdb_memory_mb=128, threads=2,
                          spill_root=str(tmp_path), spill_limit_mb=64)  # fmt: skip
    made = WorkerPool(limits, 2)
    yield made
    made.close()


def _long(pool: WorkerPool) -> Execution:
    ex = Execution(pool, Plan(sql=LONG), "run", timeout_s=60, batch_rows=1024,
                   translate=lambda kind, message: RuntimeError(f"{kind}: {message}"))  # fmt: skip
    assert len(ex.stream().read_all()) == 1
    ex.close()
    return ex


def test_the_worker_is_lent_again_once_its_database_is_closed(pool) -> None:
    worker = _long(pool).worker
    assert worker.settling  # answered first
    again = pool.take()
    assert again is worker and not worker.settling
    pool.give_back(again, healthy=True)
    assert _long(pool).worker is worker


def test_a_worker_that_grew_is_replaced_when_it_is_taken(pool, monkeypatch) -> None:
    worker = _long(pool).worker
    monkeypatch.setattr(WorkerPool, "_grown", staticmethod(lambda w: True))
    other = pool.take()
    assert other is not worker and worker.killed
    pool.give_back(other, healthy=False)


def test_messages_sent_back_to_back_are_received_one_at_a_time() -> None:
    """An answer and the "settled" after it can arrive in one read: each is received whole."""
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        protocol.send(a, {"rows": 1, "settling": True})
        protocol.send(a, {"settled": True})
        protocol.send(a, {"op": "run"}, [r])
        protocol.send(a, {"op": "next", "pad": "x" * 10_000})
        assert protocol.receive(b) == ({"rows": 1, "settling": True}, [])
        assert protocol.receive(b) == ({"settled": True}, [])
        request, fds = protocol.receive(b)
        assert request == {"op": "run"} and len(fds) == 1
        os.close(fds[0])
        assert protocol.receive(b) == ({"op": "next", "pad": "x" * 10_000}, [])
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()
