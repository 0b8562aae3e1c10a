"""Nothing uncommitted ever becomes visible in Kafka (DoPut): an abandoned try's messages, a
late retry's duplicates and a fenced writer's late deliveries are skipped by the next append,
in plain, pinned and streaming reads and in movers; the topic's own producers' messages are
not. (Before skip ranges, the first three cases showed extra or duplicated rows.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import InvalidArgument, Unavailable
from planners.kafka.produce import tag
from planners.kafka.ranges import skips, visible, with_range
from tests.gateway.helpers import IcebergFixture
from tests.gateway.kafka_helpers import new_topic, produce

pytestmark = pytest.mark.integration
SCHEMA = [{"name": "id", "type": "int64", "nullable": False}, {"name": "v", "type": "string"}]


@pytest.fixture
def topic(client: HarnessClient, kafka_bootstrap: str) -> str:
    topic = new_topic(kafka_bootstrap)
    client.create_table("t", SCHEMA)
    config = {"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0}
    client.add_source("t", "k", "kafka", config=config, state={"low": 0, "high": 0})
    return topic


def rows(a: int, b: int) -> pa.Table:
    return pa.table({"id": list(range(a, b)), "v": [str(i) for i in range(a, b)]})


def ids(client: HarnessClient, **kw: Any) -> list[int]:
    return sorted(client.read("t", **kw).column("id").to_pylist())


def added(client: HarnessClient, since: int) -> list[int]:
    info = client.flight_info("t", since=since)
    return sorted(
        i
        for ep in info.endpoints
        for i in client.read_endpoint(ep).read_all().column("id").to_pylist()
    )


def fail_commit_once(catalog: Any, commit_id: str) -> Callable[[], None]:
    """The gateway dies between producing and its harness commit (once); returns what puts the
    catalog back. A DoPut's version commits through ``commit_all`` (with its group's)."""
    real, real_all = catalog.commit, catalog.commit_all
    left = [1]

    def crash() -> None:
        left[0] -= 1
        raise RuntimeError("simulated crash between produce and the harness commit")

    def flaky(table: str, cid: str, **kw: Any) -> Any:
        if cid == commit_id and left[0]:
            crash()
        return real(table, cid, **kw)

    def flaky_all(table: str, commits: list[dict[str, Any]]) -> Any:
        if any(c["commit_id"] == commit_id for c in commits) and left[0]:
            crash()
        return real_all(table, commits)

    catalog.commit, catalog.commit_all = flaky, flaky_all

    def restore() -> None:
        catalog.commit, catalog.commit_all = real, real_all

    return restore


def doput_key(gateway: Any) -> bytes:
    """The key the gateway signs DoPut headers of source ``k`` of table ``t`` with."""
    server, catalog = gateway
    return bytes(server.gw.tag_key(catalog.describe("t").table_id, "k"))


def doput_headers(key: bytes, commit_id: bytes, row: int) -> list[tuple[str, bytes]]:
    """The headers a DoPut of ``commit_id`` writes for ``row`` (a dead gateway's, say)."""
    n = b"%d" % row
    return [
        ("harness.commit-id", commit_id),
        ("harness.row", n),
        ("harness.tag", tag(key, commit_id, n)),
    ]


def harness_messages(
    gateway: Any, bootstrap: str, topic: str, first: int, n: int, commit_id: str
) -> None:
    """Messages as a DoPut of ``commit_id`` writes them (a dead gateway's, say)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap})
    key = doput_key(gateway)
    for i in range(n):
        p.produce(
            topic,
            value=b'{"id": %d, "v": "dead"}' % (first + i),
            partition=0,
            headers=doput_headers(key, commit_id.encode(), i),
        )
    assert p.flush(10) == 0


def test_abandoned_doput_never_surfaces_in_a_later_append(
    gateway: tuple[Any, Any], client: HarnessClient, topic: str
) -> None:
    _, catalog = gateway
    client.put("t", rows(0, 5), commit_id="a")
    v_a = client.describe("t").version
    restore = fail_commit_once(catalog, "x")
    with pytest.raises(Exception, match="simulated crash"):
        client.put("t", rows(100, 110), commit_id="x")  # produced, never committed nor retried
    restore()
    assert ids(client) == list(range(5))
    client.put("t", rows(5, 8), commit_id="y")
    assert ids(client) == list(range(8))
    assert added(client, v_a) == [5, 6, 7]  # the streaming read agrees
    assert ids(client, version=client.describe("t").version) == list(range(8))
    assert client.describe("t").source("k").state["skip"] == [[5, 15]]


def test_a_late_retry_after_another_append_applies_once(
    gateway: tuple[Any, Any], client: HarnessClient, topic: str
) -> None:
    _, catalog = gateway
    restore = fail_commit_once(catalog, "x")
    with pytest.raises(Exception, match="simulated crash"):
        client.put("t", rows(100, 110), commit_id="x")
    restore()
    client.put("t", rows(0, 3), commit_id="y")  # replaces x's intent marker
    client.put("t", rows(100, 110), commit_id="x")  # the late retry produces again
    assert ids(client) == list(range(3)) + list(range(100, 110))


def test_dead_writers_messages_are_skipped_and_the_topics_own_are_not(
    gateway: tuple[Any, Any], client: HarnessClient, topic: str, kafka_bootstrap: str
) -> None:
    client.put("t", rows(0, 2), commit_id="a")
    harness_messages(gateway, kafka_bootstrap, topic, 50, 3, "dead")
    produce(kafka_bootstrap, topic, [b'{"id": 60, "v": "own producer"}'])
    harness_messages(gateway, kafka_bootstrap, topic, 70, 2, "dead-too")
    client.put("t", rows(2, 4), commit_id="b")
    assert ids(client) == [0, 1, 2, 3, 60]
    assert client.describe("t").source("k").state["skip"] == [[2, 5], [6, 8]]


def test_a_fenced_writers_interleaved_deliveries_never_surface(
    gateway: tuple[Any, Any], client: HarnessClient, topic: str, kafka_bootstrap: str
) -> None:
    """A writer that lost its lease keeps delivering while the next append produces."""
    from confluent_kafka import Producer

    stop = threading.Event()
    key = doput_key(gateway)

    def zombie() -> None:
        p = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})
        i = 0
        while not stop.is_set():
            p.produce(
                topic,
                value=b'{"id": %d, "v": "zombie"}' % (10**6 + i),
                partition=0,
                headers=doput_headers(key, b"dead", i),
            )
            p.poll(0)
            i += 1
            if i % 50 == 0:
                p.flush(5)
        p.flush(10)

    t = threading.Thread(target=zombie)
    t.start()
    try:
        client.put("t", rows(0, 50_000), commit_id="b")
    finally:
        stop.set()
        t.join()
    assert ids(client) == list(range(50_000))


def test_mover_copies_only_committed_rows(
    gateway: tuple[Any, Any], client: HarnessClient, topic: str, iceberg: IcebergFixture
) -> None:
    from pipelines.mover import Mover

    _, catalog = gateway
    iceberg.create("cold", pa.schema([("id", pa.int64()), ("v", pa.string())]))
    client.add_source(
        "t", "cold", "iceberg", config=iceberg.source_config("cold"), state={"snapshot_id": None}
    )
    client.put("t", rows(0, 3), commit_id="a", source="k")
    restore = fail_commit_once(catalog, "x")
    with pytest.raises(Exception, match="simulated crash"):
        client.put("t", rows(100, 104), commit_id="x", source="k")
    restore()
    client.put("t", rows(3, 5), commit_id="y", source="k")
    Mover(client, "t", "k", "cold", wait_s=30).run_once()
    assert ids(client) == list(range(5))
    assert iceberg.catalog.load_table("db.cold").scan().to_arrow().num_rows == 5
    assert client.describe("t").source("k").state == {"low": 9, "high": 9}


def test_skip_ranges_are_checked_and_kept() -> None:
    assert visible(0, 10, [(2, 4), (6, 7)]) == [(0, 2), (4, 6), (7, 10)]
    assert visible(5, 10, [(2, 6), (9, 12)]) == [(6, 9)]
    state = {"low": 0, "high": 10, "skip": [[2, 4], [6, 7]]}
    assert with_range(state, 5, 12) == {"low": 5, "high": 12, "skip": [[6, 7]]}
    assert with_range(state, 7, 12) == {"low": 7, "high": 12}
    assert with_range(state, 0, 12, [(7, 9)]) == {"low": 0, "high": 12, "skip": [[2, 4], [6, 9]]}
    for bad in ([[4, 2]], [[2, 5], [4, 6]], [[8, 11]], [[1, True]], "0-2"):
        with pytest.raises(InvalidArgument, match="skip"):
            skips("k", {"low": 0, "high": 10, "skip": bad})


def test_a_producer_cannot_pass_its_messages_off_as_a_commits(
    gateway: tuple[Any, Any], client: HarnessClient, topic: str, kafka_bootstrap: str
) -> None:
    """Security III, finding 9. A producer of the topic that knows a commit id (describe and
    the headers show it) writes messages with that commit's headers where its retry looks:
    they are the topic's own messages, neither rows of the commit nor in the way of its
    retry (unsigned, rows 0 and 1 were taken for the commit's, and a row that is no number
    made every retry fail)."""
    from confluent_kafka import Producer

    _, catalog = gateway
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for i, row in enumerate([b"0", b"1", b"not-a-row"]):
        forged = [("harness.commit-id", b"x"), ("harness.row", row), ("harness.tag", b"0" * 32)]
        p.produce(topic, value=b'{"id": %d, "v": "forged"}' % (900 + i), partition=0,
                  headers=forged)  # fmt: skip
    assert p.flush(10) == 0
    restore = fail_commit_once(catalog, "x")
    with pytest.raises(Exception, match="simulated crash"):
        client.put("t", rows(100, 105), commit_id="x")
    restore()
    client.put("t", rows(100, 105), commit_id="x")  # the retry finds its own rows only
    assert ids(client) == [*range(100, 105), 900, 901, 902]


def test_a_retry_finding_its_intent_below_a_later_append_loses_nothing(
    gateway: tuple[Any, Any], client: HarnessClient, topic: str, kafka_bootstrap: str
) -> None:
    """A try of ``x`` recorded its intent and delivered one message, then its gateway died;
    ``y`` appended after it (skipping that message: no commit owned it) without replacing the
    marker its retry then finds (a DoPut group reads the table once: ``y`` first in it, ``x``'s
    retry after, saw the marker as it was before ``y``). The retry must produce that row
    again, not count the skipped copy below ``y``'s ``high`` as written. (It did: the full
    failover bench lost one acknowledged row, 2026-12-01.)"""
    _, catalog = gateway
    client.put("t", rows(0, 3), commit_id="a")
    harness_messages(gateway, kafka_bootstrap, topic, 100, 1, "x")  # x's row 0, offset 3
    client.put("t", rows(10, 13), commit_id="y")
    assert client.describe("t").source("k").state["skip"] == [[3, 4]]
    catalog.commit(  # x's marker as its retry found it
        "t",
        "x:intent:k",
        external_state={"harness.doput.k": {"commit_id": "x", "intent": {"start": 3}}},
    )
    client.put("t", rows(100, 102), commit_id="x")
    assert ids(client) == [0, 1, 2, 10, 11, 12, 100, 101]
    assert ids(client, version=client.describe("t").version) == [0, 1, 2, 10, 11, 12, 100, 101]


def test_a_retry_grouped_behind_another_append_applies_once(
    gateway: tuple[Any, Any], client: HarnessClient, topic: str
) -> None:
    """The failover bench's loss end to end: ``x``'s try produced its rows and its gateway died
    before the commit; its retry then queued in one DoPut group behind ``y``'s upload, and the
    group read the table once, before ``y`` committed: ``x``'s retry found its marker there,
    its rows below ``y``'s ``high`` (skipped by ``y``) and produced nothing, acknowledged with
    none of its rows visible. Each row of both, once."""
    from flight_gateway.core.write import ingest
    from tests.conftest import client_for

    server, catalog = gateway
    restore = fail_commit_once(catalog, "x")
    with pytest.raises(Exception, match="simulated crash"):
        client.put("t", rows(100, 110), commit_id="x")
    restore()
    key = ingest._Upload(server.core.gw, "t", "", {"k": pa.table({})}, 0, False).key
    held = catalog.lock("t", ["k"], owner="test", ttl_s=60)
    results: dict[str, Any] = {}

    def put(commit_id: str, data: pa.Table) -> None:
        with client_for(server) as c:
            try:
                results[commit_id] = c.put("t", data, commit_id=commit_id)
            except Exception as e:
                results[commit_id] = e

    def queued(n: int) -> None:
        deadline = time.monotonic() + 30
        while ingest._GROUPS.queued(key) < n:
            assert time.monotonic() < deadline, "the uploads did not queue"
            time.sleep(0.02)

    threads = [threading.Thread(target=put, args=("y", rows(0, 3)))]
    threads[0].start()
    queued(1)  # y leads, waiting for the lock
    threads.append(threading.Thread(target=put, args=("x", rows(100, 110))))
    threads[1].start()
    queued(2)
    catalog.unlock(held.lock_id)
    for t in threads:
        t.join(60)
    assert all(r["applied"] for r in results.values()), results
    assert ids(client) == [0, 1, 2, *range(100, 110)]


def _topic_ids(bootstrap: str, topic: str) -> list[int]:
    """The ``id`` of every message in the topic's partition 0 (what was produced, committed
    or not)."""
    import json

    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}",
                  "enable.auto.commit": False})  # fmt: skip
    try:
        end = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[int] = []
        at, deadline = 0, time.monotonic() + 30
        while at < end and time.monotonic() < deadline:
            for m in c.consume(500, timeout=1):
                if m.error() is None:
                    at = m.offset() + 1
                    if m.value():
                        out.append(int(json.loads(m.value())["id"]))
        return out
    finally:
        c.close()


def test_a_failed_commit_in_a_group_stops_the_uploads_after_it(
    gateway: tuple[Any, Any], client: HarnessClient, topic: str, kafka_bootstrap: str
) -> None:
    """Each Kafka upload of a DoPut group commits before the next one writes (the next intent
    would replace its marker). When that commit fails, the uploads after it fail without
    producing anything (they would have written on top of a state no version published), and
    each retry applies once."""
    from flight_gateway.core.write import ingest
    from tests.conftest import client_for

    server, catalog = gateway
    key = ingest._Upload(server.core.gw, "t", "", {"k": pa.table({})}, 0, False).key
    held = catalog.lock("t", ["k"], owner="test", ttl_s=60)
    real_all = catalog.commit_all

    def refusing(table: str, commits: list[dict[str, Any]]) -> Any:
        if any(c["commit_id"] == "a" for c in commits):  # a check refused it, say
            return [Unavailable("simulated refusal of the harness commit") for _ in commits]
        return real_all(table, commits)

    catalog.commit_all = refusing
    results: dict[str, Any] = {}
    uploads = {"a": rows(0, 10), "b": rows(10, 20), "c": rows(20, 30)}

    def put(commit_id: str) -> None:
        with client_for(server) as c:
            try:
                results[commit_id] = c.put("t", uploads[commit_id], commit_id=commit_id)
            except Exception as e:
                results[commit_id] = e

    threads = []
    for n, cid in enumerate(uploads, start=1):  # a leads, b and c queue behind it
        threads.append(threading.Thread(target=put, args=(cid,)))
        threads[-1].start()
        deadline = time.monotonic() + 30
        while ingest._GROUPS.queued(key) < n:
            assert time.monotonic() < deadline, "the uploads did not queue"
            time.sleep(0.02)
    catalog.unlock(held.lock_id)
    for t in threads:
        t.join(60)
    catalog.commit_all = real_all
    assert all("simulated refusal" in str(r) for r in results.values()), results
    assert sorted(_topic_ids(kafka_bootstrap, topic)) == list(range(10))  # a's only
    assert ids(client) == []
    for cid in uploads:
        assert client.put("t", uploads[cid], commit_id=cid)["applied"]
    assert ids(client) == list(range(30))
