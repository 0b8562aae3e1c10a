"""Reading exact offset ranges of one partition, and scanning its tail (for DoPut retries)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from flight_gateway.errors import Unavailable
from planners.kafka.config import KafkaConfig, consumer

#: Messages one read holds at a time before decoding them (each a librdkafka message of a few
#: hundred bytes beyond its payload); with the consumer's prefetch bounds (``config.consumer``)
#: it keeps one read's buffered messages the same however long its range.
BATCH_MESSAGES = 8 * 1024


def consume_range(
    config: KafkaConfig, low: int, high: int, chunk: int = BATCH_MESSAGES
) -> Iterator[list[Any]]:
    """Messages with low <= offset < high, in chunks; raises Unavailable if the range cannot
    be read completely (a read never ends early looking complete)."""
    from confluent_kafka import KafkaError, TopicPartition

    if low >= high:
        return
    topic, partition, timeout = config.topic, config.partition, config.read_timeout_s
    c = consumer(config)
    try:
        c.assign([TopicPartition(topic, partition, low)])
        next_offset = low
        last_progress = time.monotonic()
        out: list[Any] = []
        while next_offset < high:
            msgs = c.consume(num_messages=min(chunk, high - next_offset), timeout=0.5)
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise Unavailable(f"kafka {topic}/{partition}: {err}")
                off = m.offset()
                if off >= high:
                    next_offset = high
                    break
                out.append(m)
                next_offset = off + 1
            if msgs:
                last_progress = time.monotonic()
            else:
                # Offsets past the last message may be markers: the position tells.
                pos = c.position([TopicPartition(topic, partition)])[0].offset
                if pos >= high:
                    break
                if time.monotonic() - last_progress > timeout:
                    raise Unavailable(
                        f"kafka {topic}/{partition}: read stalled at offset {next_offset} of "
                        f"[{low}, {high}) for {timeout:.0f}s"
                    )
            if len(out) >= chunk:
                yield out
                out = []
        if out:
            yield out
    finally:
        c.close()


def scan_tail(config: KafkaConfig, start: int, idle_s: float = 1.0) -> Iterator[list[Any]]:
    """Messages from ``start`` to the end of the partition, until ``idle_s`` without any (not the
    watermark, which may lag)."""
    from confluent_kafka import TopicPartition

    c = consumer(config, "harness-doput")
    try:
        c.assign([TopicPartition(config.topic, config.partition, start)])
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < idle_s:
            msgs = [m for m in c.consume(1000, timeout=0.2) if m.error() is None]
            if msgs:
                idle_since = time.monotonic()
                yield msgs
    finally:
        c.close()
