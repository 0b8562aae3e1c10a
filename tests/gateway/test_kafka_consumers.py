"""The gateway-wide bound on open Kafka consumers (``planners.kafka.consumers``), against the
real broker: many reads share a few consumers, a stream whose client stops reading gives its
consumer up, and a read that cannot get one in time is refused as busy."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.flight as fl
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import Busy
from planners.kafka.consumers import POOL
from tests.gateway.helpers import client_for, running_gateway
from tests.gateway.kafka_helpers import json_values, new_topic, produce

pytestmark = pytest.mark.integration

SCHEMA = [
    {"name": "id", "type": "int64"},
    {"name": "msg", "type": "string"},
    {"name": "_kafka_offset", "type": "int64"},
]


class _Counted:
    """Wraps librdkafka's Consumer: how many are open at once, counted exactly where they are
    made and closed (independent of the pool's own count; sampling threads from /proc missed
    reads that opened and closed theirs between two samples on a busy machine)."""

    def __init__(self, real: Any) -> None:
        self.real, self.open, self.peak = real, 0, 0
        self.lock = threading.Lock()

    def __call__(self, settings: Any) -> Any:
        counter = self

        class Consumer(self.real):  # type: ignore[misc, valid-type]
            def __init__(self, conf: Any) -> None:
                super().__init__(conf)
                with counter.lock:
                    counter.open += 1
                    counter.peak = max(counter.peak, counter.open)
                self._counted = True

            def close(self) -> None:
                try:
                    super().close()
                finally:
                    with counter.lock:
                        if self._counted:
                            counter.open -= 1
                            self._counted = False

        return Consumer(settings)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> _Counted:
    import confluent_kafka

    c = _Counted(confluent_kafka.Consumer)
    monkeypatch.setattr(confluent_kafka, "Consumer", c)
    return c


@pytest.fixture
def limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HarnessClient]:
    """A gateway allowing 2 Kafka consumers, which it waits up to 20 s for."""
    limits = {"kinds": {"kafka": {"max_consumers": 2, "consumer_wait_s": 20}}}
    monkeypatch.setattr(POOL, "park_s", 0.3)
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", limits=limits) as (server, _):
        assert POOL.limit == 2
        c = client_for(server)
        yield c
        c.close()
    POOL.configure()


def _kafka_table(client: HarnessClient, bootstrap: str, name: str, n: int, msg: str, task: int):
    topic = new_topic(bootstrap)
    produce(bootstrap, topic, json_values([{"id": i, "msg": msg} for i in range(n)]))
    source = {
        "name": "k0",
        "kind": "kafka",
        "config": {
            "bootstrap_servers": bootstrap,
            "topic": topic,
            "partition": 0,
            "max_task_messages": task,
        },
        "state": {"low": 0, "high": n},
    }
    client.create_table(name, SCHEMA)
    client.commit(name, add_sources=[source])


def test_concurrent_reads_share_the_bounded_consumers(
    limited: HarnessClient, kafka_bootstrap: str, counted: _Counted
) -> None:
    """8 clients read a 12-endpoint Kafka table at once: every read is exact, and the process
    never has more than 2 Kafka consumers open at once."""
    n = 12_000
    _kafka_table(limited, kafka_bootstrap, "k", n, "m", task=1_000)
    assert len(limited.flight_info("k").endpoints) == 12
    results, errors = [], []

    def read() -> None:
        try:
            results.append(sorted(limited.read("k", columns=["id"]).column("id").to_pylist()))
        except Exception as e:  # reported below
            errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(8)]
    for t in readers:
        t.start()
    for t in readers:
        t.join(120)
    assert errors == []
    assert results == [list(range(n))] * 8
    assert 1 <= counted.peak <= 2, counted.peak
    assert counted.open == 0 and POOL.open_count() == 0


def test_a_stream_whose_client_stops_reading_gives_its_consumer_up(
    limited: HarnessClient, kafka_bootstrap: str
) -> None:
    """Two streams take both consumers and their clients stop after one batch. Another read
    still completes (it takes a parked consumer); the stopped streams then finish, each row
    exactly once (they reopen at their next offset)."""
    n = 40_000
    # Two topics: two streams of one range would share what the first decoded
    # (``planners.kafka.cache``), and the second might need no consumer at all.
    for name in ("slow", "slow2"):
        _kafka_table(limited, kafka_bootstrap, name, n, "x" * 1_000, task=n)
    _kafka_table(limited, kafka_bootstrap, "other", 3_000, "y", task=10_000)
    raw = fl.connect(limited.uri)
    try:  # closed whatever happens: open streams would keep the gateway from shutting down
        streams = [raw.do_get(limited.flight_info(t).endpoints[0].ticket)
                   for t in ("slow", "slow2")]  # fmt: skip
        firsts = [s.read_chunk().data for s in streams]
        deadline = time.monotonic() + 10
        while POOL.open_count() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # both streams are parked with their consumers open
        assert POOL.open_count() == 2

        t0 = time.monotonic()
        other = limited.read("other", columns=["id"]).column("id").to_pylist()
        assert sorted(other) == list(range(3_000))
        assert time.monotonic() - t0 < 15  # well within the 20 s wait: it did not wait it out

        for first, stream in zip(firsts, streams, strict=True):
            ids = first.column(0).to_pylist() + stream.read_all().column("id").to_pylist()
            assert ids == list(range(n))
    finally:
        raw.close()


def test_a_read_that_cannot_get_a_consumer_in_time_is_busy(
    limited: HarnessClient, kafka_bootstrap: str
) -> None:
    """With both consumers held by reads that are reading (not parked), a read waits
    ``consumer_wait_s`` and is refused with RESOURCE_EXHAUSTED, kind busy; it reads once
    one is free. Nothing else in the gateway is affected."""
    _kafka_table(limited, kafka_bootstrap, "k", 100, "m", task=1_000)
    POOL.configure(2, wait_s=0.5)
    with (
        POOL.lease(lambda _: object(), "held 1") as a,
        POOL.lease(lambda _: object(), "held 2") as b,
    ):
        a.get(0), b.get(0)
        impatient = HarnessClient(limited.uri, busy_wait_s=0)
        with pytest.raises(Busy, match=r"limits\.kinds\.kafka"):
            impatient.read("k")
        impatient.close()
    assert sorted(limited.read("k").column("id").to_pylist()) == list(range(100))
