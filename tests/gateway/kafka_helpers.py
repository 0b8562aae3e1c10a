"""Producing test data to the real Kafka-protocol broker; offsets come from delivery reports."""

from __future__ import annotations

import io
import json
import struct
import uuid
from typing import Any


def new_topic(bootstrap: str, partitions: int = 1) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"t-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the futures
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    for f in futures.values():
        f.result(30)
    return name


def produce(
    bootstrap: str,
    topic: str,
    values: list[bytes | None],
    *,
    partition: int = 0,
    keys: list[bytes] | None = None,
    timestamps: list[int] | None = None,
) -> list[int]:
    """Produce and return the offsets the broker assigned, in order."""
    from confluent_kafka import Producer

    offsets: dict[int, int] = {}

    def report(i: int):
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                raise RuntimeError(err)
            offsets[i] = msg.offset()

        return cb

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2})
    for i, v in enumerate(values):
        kwargs: dict[str, Any] = {"partition": partition, "on_delivery": report(i)}
        if keys is not None:
            kwargs["key"] = keys[i]
        if timestamps is not None:
            kwargs["timestamp"] = timestamps[i]
        p.produce(topic, value=v, **kwargs)
    assert p.flush(30) == 0
    return [offsets[i] for i in range(len(values))]


def json_values(rows: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps(r).encode() for r in rows]


def avro_values(schema: dict[str, Any], rows: list[dict[str, Any]], schema_id: int) -> list[bytes]:
    import fastavro

    parsed = fastavro.parse_schema(schema)
    out = []
    for r in rows:
        buf = io.BytesIO()
        buf.write(b"\x00" + struct.pack(">I", schema_id))
        fastavro.schemaless_writer(buf, parsed, r)
        out.append(buf.getvalue())
    return out
