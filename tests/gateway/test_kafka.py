"""Kafka sources against a real Kafka-protocol broker."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import threading
import time

import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import InvalidArgument
from tests.gateway.kafka_helpers import avro_values, json_values, new_topic, produce

pytestmark = pytest.mark.integration

SCHEMA = [
    {"name": "id", "type": "int64"},
    {"name": "msg", "type": "string"},
    {"name": "_kafka_partition", "type": "int32"},
    {"name": "_kafka_offset", "type": "int64"},
    {"name": "_kafka_timestamp", "type": "timestamp[ms, tz=UTC]"},
    {"name": "_kafka_key", "type": "string"},
    {"name": "_source", "type": "string"},
]


def kafka_source(bootstrap: str, topic: str, low: int, high: int, **config: object) -> dict:
    return {
        "name": "k0",
        "kind": "kafka",
        "config": {"bootstrap_servers": bootstrap, "topic": topic, "partition": 0, **config},
        "state": {"low": low, "high": high},
    }


@pytest.fixture
def topic10(kafka_bootstrap: str) -> tuple[str, list[int]]:
    topic = new_topic(kafka_bootstrap)
    rows = [{"id": i, "msg": f"m{i}"} for i in range(10)]
    offsets = produce(
        kafka_bootstrap, topic, json_values(rows), keys=[str(i).encode() for i in range(10)]
    )
    return topic, offsets


@pytest.mark.parametrize(
    ("low", "high", "task_size", "expected_ids", "endpoints"),
    [
        (0, 10, 1000, list(range(10)), 1),
        (3, 3, 1000, [], 0),
        (4, 5, 1000, [4], 1),
        (0, 10, 3, list(range(10)), 4),
        (2, 9, 3, list(range(2, 9)), 3),
    ],
)
def test_offset_ranges_are_exact(
    client: HarnessClient,
    kafka_bootstrap: str,
    topic10,
    low,
    high,
    task_size,
    expected_ids,
    endpoints,
) -> None:
    topic, offsets = topic10
    assert offsets == list(range(10))
    client.create_table("k", SCHEMA)
    client.commit(
        "k",
        add_sources=[kafka_source(kafka_bootstrap, topic, low, high, max_task_messages=task_size)],
    )
    info = client.flight_info("k")
    assert len(info.endpoints) == endpoints
    t = client.read("k").sort_by("id")
    assert t.column("id").to_pylist() == expected_ids
    assert t.column("_kafka_offset").to_pylist() == expected_ids
    assert t.column("_kafka_key").to_pylist() == [str(i) for i in expected_ids]
    assert set(t.column("_source").to_pylist()) <= {"k0"}
    assert set(t.column("_kafka_partition").to_pylist()) <= {0}


def test_pinned_range_ignores_newer_messages(
    client: HarnessClient, kafka_bootstrap: str, topic10
) -> None:
    topic, _ = topic10
    client.create_table("k", SCHEMA)
    v = client.commit("k", add_sources=[kafka_source(kafka_bootstrap, topic, 0, 10)])
    produce(kafka_bootstrap, topic, json_values([{"id": 100 + i, "msg": "new"} for i in range(5)]))
    assert client.read("k", version=v).num_rows == 10
    v2 = client.commit("k", updates=[{"source": "k0", "state": {"low": 0, "high": 15}}])
    assert client.read("k", version=v2).num_rows == 15
    assert client.read("k", version=v).num_rows == 10


def test_offset_and_timestamp_pushdown(client: HarnessClient, kafka_bootstrap: str) -> None:
    topic = new_topic(kafka_bootstrap)
    base = 1_700_000_000_000
    produce(
        kafka_bootstrap,
        topic,
        json_values([{"id": i, "msg": "x"} for i in range(20)]),
        timestamps=[base + i * 1000 for i in range(20)],
    )
    client.create_table("k", SCHEMA)
    client.commit(
        "k", add_sources=[kafka_source(kafka_bootstrap, topic, 0, 20, max_task_messages=5)]
    )
    info = client.flight_info("k", filter="_kafka_offset >= 12 AND _kafka_offset < 14")
    assert len(info.endpoints) == 1  # only the task holding offsets 12-13 is planned
    assert client.read("k", filter="_kafka_offset >= 12 AND _kafka_offset < 14").column(
        "id"
    ).to_pylist() == [12, 13]
    when = dt.datetime.fromtimestamp((base + 15_000) / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    got = client.read("k", filter=f"_kafka_timestamp >= TIMESTAMP '{when}'")
    assert sorted(got.column("id").to_pylist()) == [15, 16, 17, 18, 19]
    assert (
        len(client.flight_info("k", filter=f"_kafka_timestamp >= TIMESTAMP '{when}'").endpoints)
        <= 4
    )


def test_poison_message_fail_policy(client: HarnessClient, kafka_bootstrap: str) -> None:
    topic = new_topic(kafka_bootstrap)
    produce(
        kafka_bootstrap, topic, [b'{"id": 1, "msg": "ok"}', b"{not json", b'{"id": 3, "msg": "ok"}']
    )
    client.create_table("k", SCHEMA)
    client.commit("k", add_sources=[kafka_source(kafka_bootstrap, topic, 0, 3)])
    with pytest.raises(InvalidArgument, match=rf"1 undecodable json message\(s\) at {topic}/0@1"):
        client.read("k")


def test_poison_message_dead_letter_policy(client: HarnessClient, kafka_bootstrap: str) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic, dlq = new_topic(kafka_bootstrap), new_topic(kafka_bootstrap)
    produce(
        kafka_bootstrap, topic, [b'{"id": 1, "msg": "ok"}', b"\xff\xfe", b'{"id": 3, "msg": "ok"}']
    )
    client.create_table("k", SCHEMA)
    client.commit(
        "k",
        add_sources=[
            kafka_source(
                kafka_bootstrap, topic, 0, 3, on_error="dead_letter", dead_letter_topic=dlq
            )
        ],
    )
    assert sorted(client.read("k").column("id").to_pylist()) == [1, 3]
    c = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": "dlq-check", "enable.auto.commit": False}
    )
    c.assign([TopicPartition(dlq, 0, 0)])
    msgs: list = []
    deadline = time.monotonic() + 10
    while not msgs and time.monotonic() < deadline:
        msgs += c.consume(10, timeout=0.5)
    msgs += c.consume(10, timeout=0.5)  # nothing else may be there
    c.close()
    assert [(m.key(), m.value()) for m in msgs] == [(f"{topic}/0/1".encode(), b"\xff\xfe")]


AVRO = {
    "type": "record",
    "name": "Log",
    "fields": [{"name": "id", "type": "long"}, {"name": "msg", "type": ["null", "string"]}],
}


def test_avro_inline_schema(client: HarnessClient, kafka_bootstrap: str) -> None:
    topic = new_topic(kafka_bootstrap)
    produce(
        kafka_bootstrap,
        topic,
        avro_values(AVRO, [{"id": i, "msg": f"a{i}"} for i in range(5)], schema_id=7),
    )
    client.create_table("k", SCHEMA[:2])
    client.commit(
        "k",
        add_sources=[kafka_source(kafka_bootstrap, topic, 0, 5, format="avro", avro_schema=AVRO)],
    )
    assert client.read("k", filter="id >= 3").sort_by("id").column("msg").to_pylist() == [
        "a3",
        "a4",
    ]


def test_avro_schema_registry(client: HarnessClient, kafka_bootstrap: str) -> None:
    class Registry(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/schemas/ids/42":
                body = json.dumps({"schema": json.dumps(AVRO)}).encode()
                self.send_response(200)
            else:
                body = b'{"error_code": 40403}'
                self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        topic = new_topic(kafka_bootstrap)
        produce(
            kafka_bootstrap,
            topic,
            avro_values(AVRO, [{"id": i, "msg": None} for i in range(4)], schema_id=42),
        )
        client.create_table("k", SCHEMA[:2])
        url = f"http://127.0.0.1:{server.server_address[1]}"
        client.commit(
            "k",
            add_sources=[
                kafka_source(kafka_bootstrap, topic, 0, 4, format="avro", schema_registry_url=url)
            ],
        )
        t = client.read("k")
        assert (
            sorted(t.column("id").to_pylist()) == [0, 1, 2, 3] and t.column("msg").null_count == 4
        )
    finally:
        server.shutdown()


def test_a_range_longer_than_the_prefetch_bound_reads_exactly(
    client: HarnessClient, kafka_bootstrap: str
) -> None:
    """A read prefetches at most 8K messages / 4 MB ahead and decodes 8K at a time
    (``planners.kafka.config``): a range of 20,000 small messages and a dozen of ~0.9 MB (over
    the prefetch's byte bound together) is read whole, in order, each message once."""
    from planners.kafka.consume import BATCH_MESSAGES

    topic = new_topic(kafka_bootstrap)
    small = 20_000
    big = 12
    assert small > 2 * BATCH_MESSAGES
    rows = [{"id": i, "msg": "s"} for i in range(small)]
    rows += [{"id": small + i, "msg": "x" * 900_000} for i in range(big)]
    produce(kafka_bootstrap, topic, json_values(rows))
    client.create_table("k", SCHEMA)
    client.commit(
        "k",
        add_sources=[kafka_source(kafka_bootstrap, topic, 0, small + big, max_task_messages=10**6)],
    )
    assert len(client.flight_info("k").endpoints) == 1  # one consumer reads the whole range
    t = client.read("k", columns=["id", "msg", "_kafka_offset"])
    assert t.column("id").to_pylist() == list(range(small + big))
    assert t.column("_kafka_offset").to_pylist() == list(range(small + big))
    assert [len(m) for m in t.column("msg").to_pylist()[small:]] == [900_000] * big
