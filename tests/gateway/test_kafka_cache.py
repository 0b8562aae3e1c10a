"""Decoded Kafka ranges kept between reads (``planners.kafka.cache``), on a real broker: a read
consumes only what no earlier read decoded, and returns the same rows as a read without it."""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import pyarrow as pa
import pytest

from clients import HarnessClient
from planners.kafka.cache import CACHE, Piece, RangeCache, cached_range
from tests.gateway.kafka_helpers import json_values, new_topic, produce

pytestmark = pytest.mark.integration
SCHEMA = [
    {"name": "id", "type": "int64"},
    {"name": "msg", "type": "string"},
    {"name": "_kafka_offset", "type": "int64"},
]


def _source(bootstrap: str, topic: str, low: int, high: int, **config: object) -> dict:
    return {
        "name": "k0", "kind": "kafka",
        "config": {"bootstrap_servers": bootstrap, "topic": topic, "partition": 0, **config},
        "state": {"low": low, "high": high},
    }  # fmt: skip


def _rows(first: int, n: int) -> list[bytes]:
    return json_values([{"id": i, "msg": f"m{i}"} for i in range(first, first + n)])


def _counts(topic: str) -> tuple[int, int]:
    """(rows consumed, rows served from the cache) of reads of ``topic``."""
    mine = [k for k in {*CACHE.misses, *CACHE.hits} if k.startswith(f"{topic}/0/")]
    return sum(CACHE.misses[k] for k in mine), sum(CACHE.hits[k] for k in mine)


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    CACHE.clear()
    yield
    CACHE.clear()


def test_a_growing_range_is_consumed_once(client: HarnessClient, kafka_bootstrap: str) -> None:
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, _rows(0, 300))
    client.create_table("t", SCHEMA)
    client.commit("t", add_sources=[_source(kafka_bootstrap, topic, 0, 300)])
    first = client.read("t")
    assert first.column("id").to_pylist() == list(range(300))
    assert _counts(topic) == (300, 0)

    produce(kafka_bootstrap, topic, _rows(300, 200))
    client.commit("t", updates=[{"source": "k0", "state": {"low": 100, "high": 500}}])
    got = client.read("t")
    assert got.column("id").to_pylist() == list(range(100, 500))
    assert got.column("_kafka_offset").to_pylist() == list(range(100, 500))
    assert _counts(topic) == (500, 200)  # only the 200 new ones consumed

    again = client.read("t", columns=["id"])  # another projection: decoded apart
    assert again.column("id").to_pylist() == list(range(100, 500))
    assert _counts(topic) == (900, 200)


def test_rows_match_a_read_without_the_cache(client: HarnessClient, kafka_bootstrap: str) -> None:
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, _rows(0, 50))
    client.create_table("t", SCHEMA)
    client.commit("t", add_sources=[_source(kafka_bootstrap, topic, 0, 50, max_task_messages=7)])
    for low, high in [(10, 20), (0, 50), (5, 45), (20, 30), (0, 50)]:
        client.commit("t", updates=[{"source": "k0", "state": {"low": low, "high": high}}])
        cached = client.read("t", filter="msg <> 'm13'")
        CACHE.clear()
        fresh = client.read("t", filter="msg <> 'm13'")
        assert cached.sort_by("_kafka_offset").equals(fresh.sort_by("_kafka_offset"))
        assert sorted(cached.column("id").to_pylist()) == [i for i in range(low, high) if i != 13]


def _pieces(offsets: list[int], reached: list[int]) -> list[tuple[pa.Table, array[int], int]]:
    out, i = [], 0
    for end in reached:
        mine = [o for o in offsets[i:] if o < end]
        i += len(mine)
        out.append((pa.table({"o": mine}), array("q", mine), end))
    return out


def test_gaps_in_offsets_and_pieces_met_halfway() -> None:
    """Offsets without a message (transaction markers, undecodable ones left out) are covered
    by the piece around them; a read of a range whose middle is held consumes the two ends."""
    cache, key = RangeCache(), "k"
    present = [o for o in range(100) if o % 10 != 9]  # every tenth offset a marker
    asked: list[tuple[int, int]] = []

    def consume(a: int, b: int) -> Iterator[tuple[pa.Table, array[int], int]]:
        asked.append((a, b))
        ends = [*range(a + 16, b, 16), b]
        yield from _pieces([o for o in present if a <= o < b], ends)

    def read(a: int, b: int) -> list[int]:
        return [
            o for t in cached_range(key, a, b, consume, cache) for o in t.column("o").to_pylist()
        ]

    assert read(40, 60) == [o for o in present if 40 <= o < 60]
    assert read(0, 100) == present
    assert asked == [(40, 60), (0, 40), (60, 100)]
    assert read(33, 77) == [o for o in present if 33 <= o < 77]
    assert len(asked) == 3


def test_the_least_recently_used_pieces_go_past_the_bound() -> None:
    rows = pa.table({"o": list(range(100))})
    size = rows.nbytes + 8 * 100
    cache = RangeCache(max_bytes=size * 4 + 1)
    for i in range(5):
        cache.add(
            "k", Piece(i * 100, (i + 1) * 100, rows, array("q", range(i * 100, (i + 1) * 100)))
        )
    assert cache.covering("k", 50) is None  # the oldest went
    assert all(cache.covering("k", i * 100 + 5) is not None for i in range(1, 5))
