"""DoPut into a Kafka partition: JSON messages tagged with the commit id, exactly once per
commit id.

Every message carries ``harness.commit-id`` and ``harness.row`` headers. A produce cannot be
found again by commit id without a scan, so before producing the kind records where this commit
starts (``AppendContext.record_intent``, committed to ``external_state`` by the gateway); a retry
of the same commit gets that start back, scans from there and produces only the missing rows.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from flight_gateway.errors import Unavailable
from planners.kafka.config import KafkaConfig
from planners.kafka.consume import scan_tail
from planners.kind import AppendContext

#: One encoder for every message (``json.dumps`` with ``default`` builds one per call).
_ENCODER = json.JSONEncoder(default=str)
COMMIT_HEADER = "harness.commit-id"
ROW_HEADER = "harness.row"


def produce(producer: Any, topic: str, **kwargs: Any) -> None:
    """``producer.produce`` that waits for deliveries when librdkafka's local queue is full
    (``BufferError``) instead of failing the write, then serves delivery callbacks."""
    while True:
        try:
            producer.produce(topic, **kwargs)
            break
        except BufferError:
            producer.poll(0.1)  # deliveries free the queue
    producer.poll(0)


def _already_produced(config: KafkaConfig, start: int, commit_id: str) -> tuple[set[int], int]:
    """Rows of ``commit_id`` an earlier try produced, and the last offset seen from ``start``."""
    present: set[int] = set()
    last = start - 1
    for chunk in scan_tail(config, start):
        for m in chunk:
            headers = dict(m.headers() or [])
            if headers.get(COMMIT_HEADER) == commit_id.encode():
                present.add(int(headers[ROW_HEADER]))
            last = max(last, m.offset())
    return present, last


def append(config: KafkaConfig, ctx: AppendContext, rows: pa.Table) -> dict[str, Any]:
    from confluent_kafka import Producer

    state = ctx.source.state
    retry = ctx.intent is not None
    start = int(ctx.intent["start"]) if ctx.intent else int(state.get("high", 0))
    if not retry:
        ctx.record_intent({"start": start})
    present, last = _already_produced(config, start, ctx.commit_id) if retry else (set(), start - 1)
    highest = [last]
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:  # one callback for every message
        if err is not None:
            errors.append(str(err))
        elif msg.offset() > highest[0]:
            highest[0] = msg.offset()

    producer = Producer(
        {"bootstrap.servers": config.bootstrap_servers, "enable.idempotence": True, "linger.ms": 5}
    )
    commit: tuple[str, str | bytes | None] = (COMMIT_HEADER, ctx.commit_id.encode())
    encode = _ENCODER.encode
    topic, partition = config.topic, config.partition
    for i, row in enumerate(rows.to_pylist()):
        if i in present:
            continue
        value = encode(row).encode()
        headers: list[tuple[str, str | bytes | None]] = [commit, (ROW_HEADER, str(i).encode())]
        try:  # the common case without the helper's call; a full queue waits in ``produce``
            producer.produce(
                topic, value=value, partition=partition, headers=headers, on_delivery=delivered
            )
        except BufferError:
            produce(
                producer,
                topic,
                value=value,
                partition=partition,
                headers=headers,
                on_delivery=delivered,
            )
        if i % 1000 == 0:
            producer.poll(0)  # serve delivery callbacks as we go
    if producer.flush(60) != 0 or errors:
        raise Unavailable(
            f"source {ctx.source.name!r}: produce to {config.topic}/{config.partition} failed: "
            f"{errors[:3]}"
        )
    high = highest[0] + 1
    return {
        **state,
        "low": int(state.get("low", 0)),
        "high": max(high, int(state.get("high", 0))),
    }
