"""A producer whose local queue fills up waits for deliveries instead of failing the write
(a full ``make bench`` once died in bench_writes with ``BufferError: Local: Queue full``)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from planners.kafka.produce import produce
from tests.gateway.kafka_helpers import new_topic

pytestmark = pytest.mark.integration


def test_a_full_local_queue_waits_instead_of_failing(kafka_bootstrap: str) -> None:
    topic = new_topic(kafka_bootstrap)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "queue.buffering.max.messages": 10})
    with pytest.raises(BufferError):  # the queue really does fill without back-pressure
        for _ in range(1000):
            producer.produce(topic, value=b"x", partition=0)
    producer.flush(30)
    for i in range(2000):
        produce(producer, topic, value=str(i).encode(), partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": topic, "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen: set[bytes] = set()
    deadline = time.monotonic() + 30
    while len(seen - {b"x"}) < 2000 and time.monotonic() < deadline:
        for m in consumer.consume(1000, timeout=1):
            if m.error() is None:
                seen.add(m.value())
    consumer.close()
    assert seen - {b"x"} == {str(i).encode() for i in range(2000)}
