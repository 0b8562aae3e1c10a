"""DoPut into a Kafka partition: JSON messages tagged with the commit id, exactly once per
commit id.

Every message carries ``harness.commit-id``, ``harness.row`` and ``harness.tag`` headers: the
tag is an HMAC of the commit id and row under the gateway's key for this table and source
(``AppendContext.tag_key``), so a producer of the topic that knows a commit id cannot pass its
own messages off as that commit's (adding rows to its retry, or making the retry fail); a
message whose tag does not verify is the topic's own. A produce cannot be found again by commit
id without a scan, so before producing the kind records where this commit
starts (``AppendContext.record_intent``, committed to ``external_state`` by the gateway); a retry
of the same commit gets that start back, scans from there and produces only the missing rows.

The new ``high`` is just past this commit's last message. DoPut messages below it that the
commit does not own — an abandoned try of another commit, a fenced writer's late deliveries —
go into the state's ``skip`` ranges, so nothing uncommitted ever becomes visible.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from typing import Any

import pyarrow as pa

from flight_gateway.protocol.errors import Unavailable
from planners.kafka.config import KafkaConfig
from planners.kafka.consume import consume_range, scan_tail
from planners.kafka.ranges import Range, bounds, merge, runs, visible, with_range
from planners.kind import AppendContext

#: One encoder for every message (``json.dumps`` with ``default`` builds one per call).
_ENCODER = json.JSONEncoder(default=str)
COMMIT_HEADER = "harness.commit-id"
ROW_HEADER = "harness.row"
TAG_HEADER = "harness.tag"


def tag(key: bytes, commit_id: bytes, row: bytes) -> bytes:
    return hmac.new(key, commit_id + b"\0" + row, hashlib.sha256).hexdigest()[:32].encode()


def _signed(key: bytes, headers: Any) -> tuple[bytes, int] | None:
    """(commit id, row) of a message a DoPut of this source wrote, or None (the topic's own
    messages, and any whose tag does not verify)."""
    h = dict(headers or [])
    commit_id, row, mark = h.get(COMMIT_HEADER), h.get(ROW_HEADER), h.get(TAG_HEADER)
    if not (isinstance(commit_id, bytes) and isinstance(row, bytes) and isinstance(mark, bytes)):
        return None
    if not hmac.compare_digest(mark, tag(key, commit_id, row)) or not row.isdigit():
        return None
    return commit_id, int(row)


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


log = logging.getLogger(__name__)
_PRODUCERS: dict[str, Any] = {}
_PRODUCERS_LOCK = threading.Lock()


def _producer(bootstrap_servers: str) -> Any:
    """One idempotent producer per cluster, shared by every append: starting one costs 0.5-1 s
    (the broker hands out a producer id), against about a millisecond for 100 messages on a
    warm one. Each message carries its own delivery callback, so appends sharing it never
    see each other's offsets or errors."""
    from confluent_kafka import Producer

    with _PRODUCERS_LOCK:
        producer = _PRODUCERS.get(bootstrap_servers)
        if producer is None:
            producer = Producer(
                {
                    "bootstrap.servers": bootstrap_servers,
                    "enable.idempotence": True,
                    "linger.ms": 5,
                },
                logger=log,  # librdkafka's own lines (a broker going away) as log records
            )
            _PRODUCERS[bootstrap_servers] = producer
        return producer


def _discard(bootstrap_servers: str, producer: Any) -> None:
    """Forget a producer after a failure (a fatal idempotence error makes it unusable)."""
    with _PRODUCERS_LOCK:
        if _PRODUCERS.get(bootstrap_servers) is producer:
            del _PRODUCERS[bootstrap_servers]


def _already_produced(
    config: KafkaConfig, start: int, commit_id: str, key: bytes
) -> dict[int, int]:
    """Row -> offset of the rows of ``commit_id`` an earlier try produced from ``start`` (the
    first copy of each: a later copy is skipped like any message no commit owns)."""
    present: dict[int, int] = {}
    wanted = commit_id.encode()
    for chunk in scan_tail(config, start):
        for m in chunk:
            signed = _signed(key, m.headers())
            if signed is not None and signed[0] == wanted:
                present.setdefault(signed[1], m.offset())
    return present


def _unowned(config: KafkaConfig, gaps: list[Range], key: bytes) -> list[Range]:
    """Offsets in ``gaps`` holding messages of another DoPut (signed headers): nobody committed
    them, since every commit's messages lie below the ``high`` it published. Other messages
    come from the topic's own producers and stay visible."""
    tagged = []
    for a, b in gaps:
        for chunk in consume_range(config, a, b):
            tagged += [m.offset() for m in chunk if _signed(key, m.headers()) is not None]
    return runs(tagged)


def _new_state(
    config: KafkaConfig, state: dict[str, Any], owned: list[Range], key: bytes
) -> dict[str, Any]:
    """``high`` just past this commit's last message; DoPut messages in between that this
    commit does not own (an abandoned try, a fenced writer's late deliveries) are skipped."""
    low, old_high = bounds("kafka", state)
    owned = [r for r in merge(owned) if r[1] > old_high]
    if not owned:
        return dict(state)
    high = owned[-1][1]
    gaps = visible(old_high, high, owned)
    return with_range(state, low, high, _unowned(config, gaps, key) if gaps else [])


def append(config: KafkaConfig, ctx: AppendContext, rows: pa.Table) -> dict[str, Any]:
    state = ctx.source.state
    retry = ctx.intent is not None
    high = int(state.get("high", 0))
    start = int(ctx.intent["start"]) if ctx.intent else high
    if not retry:
        ctx.record_intent({"start": start})
    # A retry looks from its intent's start, but never below the state's ``high``: a message
    # of an earlier try below it lies in a range a later append published, which skipped it
    # (no commit owned it then), so it is not this commit's to count and is produced again.
    # (Counted, the row was lost: one acknowledged row in the failover bench.)
    present = (
        _already_produced(config, max(start, high), ctx.commit_id, ctx.tag_key) if retry else {}
    )
    offsets = list(present.values())  # the messages this commit owns
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:  # one callback for every message
        if err is not None:
            errors.append(str(err))
        else:
            offsets.append(msg.offset())

    producer = _producer(config.bootstrap_servers)
    commit_id = ctx.commit_id.encode()
    commit: tuple[str, str | bytes | None] = (COMMIT_HEADER, commit_id)
    encode = _ENCODER.encode
    topic, partition = config.topic, config.partition
    for i, row in enumerate(rows.to_pylist()):
        if i in present:
            continue
        value = encode(row).encode()
        row_id = str(i).encode()
        headers: list[tuple[str, str | bytes | None]] = [
            commit,
            (ROW_HEADER, row_id),
            (TAG_HEADER, tag(ctx.tag_key, commit_id, row_id)),
        ]
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
        _discard(config.bootstrap_servers, producer)
        raise Unavailable(
            f"source {ctx.source.name!r}: produce to {config.topic}/{config.partition} failed: "
            f"{errors[:3]}"
        )
    return _new_state(config, dict(state), runs(offsets), ctx.tag_key)
