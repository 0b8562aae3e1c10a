"""A statement that took a while has its answer sent before its database is closed (~5-10 ms,
freeing its memory): its caller does not wait for that, and the gateway lends the worker again
only once the worker says it has, checking then whether it grew. A result that ended whole,
with no source feeding it, does not wait for its answer either: the answer is read when the
worker is lent next."""

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


def _long(pool: WorkerPool, sql: str = LONG) -> Execution:
    ex = Execution(pool, Plan(sql=sql), "run", timeout_s=60, batch_rows=1024,
                   translate=lambda kind, message: RuntimeError(f"{kind}: {message}"))  # fmt: skip
    assert len(ex.stream().read_all()) == 1
    ex.close()
    return ex


def test_the_worker_is_lent_again_once_its_database_is_closed(pool) -> None:
    worker = _long(pool).worker
    assert worker.unanswered  # the result ended whole: given back before its answer
    again = pool.take()
    assert again is worker and not worker.settling and not worker.unanswered
    pool.give_back(again, healthy=True)
    assert _long(pool).worker is worker


def test_a_whole_result_gives_its_worker_back_before_its_answer(pool) -> None:
    """Statements in turn on one worker, each given back unanswered: every answer is read
    in its turn (a typing and a run after it get their own), none is lost or read twice."""
    first = _long(pool, "SELECT 41 + 1 AS n")
    assert first.worker.unanswered and not first.worker.settling
    second = Execution(pool, Plan(sql="SELECT 'x' AS s"), "schema", timeout_s=60,
                       batch_rows=1024, translate=lambda k, m: RuntimeError(f"{k}: {m}"))  # fmt: skip
    assert second.worker is first.worker and not second.worker.unanswered
    assert second.schema().names == ["s"]
    second.close()
    third = Execution(pool, Plan(sql="SELECT 7 AS n"), "run", timeout_s=60, batch_rows=1024,
                      translate=lambda k, m: RuntimeError(f"{k}: {m}"))  # fmt: skip
    assert third.worker is first.worker
    assert third.stream().read_all().column("n").to_pylist() == [7]
    third.close()
    assert third.worker.unanswered
    taken = pool.take()
    assert taken is first.worker and not taken.unanswered
    pool.give_back(taken, healthy=True)


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
