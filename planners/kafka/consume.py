"""Reading exact offset ranges of one partition, and scanning its tail (for DoPut retries)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from flight_gateway.protocol.errors import Unavailable
from planners.kafka.config import KafkaConfig, consumer
from planners.kafka.consumers import POOL

#: Messages one read holds at a time before decoding them (each a librdkafka message of a few
#: hundred bytes beyond its payload); with the consumer's prefetch bounds (``config.consumer``)
#: it keeps one read's buffered messages the same however long its range.
BATCH_MESSAGES = 8 * 1024


def consume_range(
    config: KafkaConfig, low: int, high: int, chunk: int = BATCH_MESSAGES
) -> Iterator[list[Any]]:
    """Messages with low <= offset < high, in chunks; raises Unavailable if the range cannot
    be read completely (a read never ends early looking complete). The consumer is leased from
    ``POOL`` (``planners.kafka.consumers``) and parked while the caller has each chunk."""
    from confluent_kafka import KafkaError, TopicPartition

    if low >= high:
        return
    topic, partition, timeout = config.topic, config.partition, config.read_timeout_s
    what = f"kafka {topic}/{partition} [{low}, {high})"
    with POOL.lease(lambda offset: _assigned(config, offset), what) as lease:
        next_offset = low
        last_progress = time.monotonic()
        out: list[Any] = []
        while next_offset < high:
            c = lease.get(next_offset)
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
                with lease.parked():
                    yield out
                out = []
                last_progress = time.monotonic()
    if out:  # the consumer is closed already
        yield out


def scan_tail(config: KafkaConfig, start: int, idle_s: float = 1.0) -> Iterator[list[Any]]:
    """Messages from ``start`` to the end of the partition, until ``idle_s`` without any (not the
    watermark, which may lag)."""
    what = f"kafka {config.topic}/{config.partition} from {start}"

    def opened(offset: int) -> Any:
        return _assigned(config, offset, "harness-doput")

    with POOL.lease(opened, what) as lease:
        next_offset = start
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < idle_s:
            got = lease.get(next_offset).consume(1000, timeout=0.2)
            msgs = [m for m in got if m.error() is None]
            if msgs:
                next_offset = msgs[-1].offset() + 1
                with lease.parked():
                    yield msgs
                idle_since = time.monotonic()


def _assigned(config: KafkaConfig, offset: int, group_prefix: str = "harness-reader") -> Any:
    """A consumer of the config's partition, assigned at ``offset``."""
    from confluent_kafka import TopicPartition

    c = consumer(config, group_prefix)
    try:
        c.assign([TopicPartition(config.topic, config.partition, offset)])
    except BaseException:
        c.close()
        raise
    return c
