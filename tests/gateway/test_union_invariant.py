"""The union invariant: rows moved from a hot source to a cold one by a single commit are
visible exactly once at every version, while producers write, movers move and readers read.

Runs for HARNESS_UNION_SECONDS (default 8) in CI; set it higher for a longer soak.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from clients import HarnessClient
from planners.kafka import read_offsets
from planners.kind import ColumnSpec
from planners.postgres.versioning import server_now
from tests.gateway.helpers import IcebergFixture, versioned_table
from tests.gateway.kafka_helpers import json_values, new_topic, produce

pytestmark = [pytest.mark.slow, pytest.mark.integration]
SECONDS = float(os.environ.get("HARNESS_UNION_SECONDS", "8"))
ARROW = pa.schema([("id", pa.int64()), ("p", pa.int32()), ("payload", pa.string())])
SCHEMA = [{"name": f.name, "type": str(f.type)} for f in ARROW]


class Run:
    """Threads that run until told to stop; the first error fails the test."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []

    def loop(self, name: str, body: Callable[[], None]) -> None:
        def run() -> None:
            try:
                while not self.stop.is_set():
                    body()
            except BaseException as e:
                self.errors.append(e)
                self.stop.set()

        t = threading.Thread(target=run, name=name)
        self.threads.append(t)
        t.start()

    def finish(self, seconds: float) -> None:
        self.stop.wait(seconds)
        self.stop.set()
        for t in self.threads:
            t.join(120)
        if self.errors:
            raise self.errors[0]


@pytest.mark.parametrize("direct", [False, True], ids=["flight", "direct"])
def test_kafka_to_iceberg_exactly_once(
    client: HarnessClient, kafka_bootstrap: str, iceberg: IcebergFixture, direct: bool
) -> None:
    """With ``direct`` the readers read the cold Iceberg files themselves (direct tasks) and the
    Kafka ranges through the gateway, at the same pinned version."""
    topic = new_topic(kafka_bootstrap, partitions=2)
    cold = iceberg.create("moved", ARROW)
    client.create_table("logs", SCHEMA, partition_by=["p"])
    kafka_cfg = {
        p: {
            "bootstrap_servers": kafka_bootstrap,
            "topic": topic,
            "partition": p,
            "max_task_messages": 50,
        }
        for p in (0, 1)
    }
    client.commit(
        "logs",
        add_sources=[
            *(
                {
                    "name": f"k{p}",
                    "kind": "kafka",
                    "partition": {"p": p},
                    "config": kafka_cfg[p],
                    "state": {"low": 0, "high": 0},
                }
                for p in (0, 1)
            ),
            {
                "name": "cold",
                "kind": "iceberg",
                "config": {**iceberg.source_config("moved"), "direct": direct},
                "state": {"snapshot_id": None},
            },
        ],
    )
    delivered: dict[tuple[int, int], int] = {}  # (partition, offset) -> id
    next_id = [0]
    run = Run()
    stats = {"produced": 0, "moves": 0, "reads": 0, "rereads": 0, "direct_tasks": 0}

    def producer() -> None:
        for p in (0, 1):
            ids = list(range(next_id[0], next_id[0] + 15))
            next_id[0] += 15
            offsets = produce(
                kafka_bootstrap,
                topic,
                json_values([{"id": i, "p": p, "payload": f"x{i}"} for i in ids]),
                partition=p,
            )
            delivered.update({(p, o): i for o, i in zip(offsets, ids, strict=True)})
            stats["produced"] += len(ids)
            # The ingester's step: advance high to what the broker acknowledged (never the watermark).
            with client.lock("logs", [f"k{p}"], owner="ingester", ttl_s=30, wait_s=30) as lock:
                state = client.describe("logs").source(f"k{p}").state
                client.commit(
                    "logs",
                    lock=lock,
                    updates=[
                        {
                            "source": f"k{p}",
                            "state": {"low": state["low"], "high": max(offsets) + 1},
                        }
                    ],
                )

    cols = [ColumnSpec(i + 1, f.name, str(f.type)) for i, f in enumerate(ARROW)]
    turn = [0]

    def mover() -> None:
        p = turn[0] % 2
        turn[0] += 1
        with client.lock("logs", [f"k{p}", "cold"], owner="mover", ttl_s=60, wait_s=30) as lock:
            state = client.describe("logs").source(f"k{p}").state
            low, high = state["low"], state["high"]
            if high == low:
                time.sleep(0.05)
                return
            rows = read_offsets(kafka_cfg[p], low, high, cols)
            assert rows.num_rows == high - low
            cold.append(rows.cast(ARROW))
            client.commit(
                "logs",
                lock=lock,
                summary={"operation": "kafka-flush"},
                updates=[
                    {
                        "source": "cold",
                        "state": {"snapshot_id": cold.current_snapshot().snapshot_id},
                    },
                    {"source": f"k{p}", "state": {"low": high, "high": high}},
                ],
            )
            stats["moves"] += 1

    seen: dict[int, list[int]] = {}

    def reader() -> None:
        info = client.flight_info("logs", direct=direct)
        version = client.pinned_version(info)
        stats["direct_tasks"] += sum(client.direct_task(ep) is not None for ep in info.endpoints)
        ids = client.read("logs", version=version, columns=["id"], direct=direct)
        ids = ids.column("id").to_pylist()
        assert len(ids) == len(set(ids)), f"duplicates at version {version}"
        d = client.describe("logs", version=version)
        highs = {s.partition["p"]: s.state["high"] for s in d.sources if s.kind == "kafka"}
        expected = {i for (p, off), i in list(delivered.items()) if off < highs[p]}
        assert set(ids) == expected, (
            f"version {version}: missing {sorted(expected - set(ids))[:5]}, extra {sorted(set(ids) - expected)[:5]}"
        )
        stats["reads"] += 1
        if version in seen:
            assert sorted(ids) == seen[version], f"version {version} re-read differently"
            stats["rereads"] += 1
        else:
            seen[version] = sorted(ids)
        if len(seen) > 3:  # re-read an old pinned version too
            old = min(seen)
            again = client.read("logs", version=old, columns=["id"], direct=direct)
            assert sorted(again.column("id").to_pylist()) == seen[old]
            stats["rereads"] += 1

    run.loop("producer", producer)
    run.loop("mover", mover)
    run.loop("reader-1", reader)
    run.loop("reader-2", reader)
    run.finish(SECONDS)
    assert stats["moves"] >= 2 and stats["reads"] >= 4 and stats["rereads"] >= 1, stats
    assert (stats["direct_tasks"] > 0) == direct, stats
    final = client.read("logs", columns=["id"]).column("id").to_pylist()
    assert sorted(final) == sorted(set(final))


def test_postgres_to_iceberg_exactly_once(
    client: HarnessClient, pg_dsn: str, iceberg: IcebergFixture
) -> None:
    table, start = versioned_table(pg_dsn, "hot", "id bigint PRIMARY KEY, p int, payload text")
    cold = iceberg.create("pgmoved", ARROW)
    client.create_table("events", SCHEMA)
    client.commit(
        "events",
        add_sources=[
            {
                "name": "hot",
                "kind": "postgres",
                "config": {"dsn": pg_dsn, "table": table},
                "state": {"as_of": start},
            },
            {
                "name": "cold",
                "kind": "iceberg",
                "config": iceberg.source_config("pgmoved"),
                "state": {"snapshot_id": None},
            },
        ],
    )
    committed: list[tuple[int, list[int]]] = []  # (version, ids inserted by that commit)
    next_id = [0]
    run = Run()
    stats = {"moves": 0, "reads": 0}

    def writer_body(conn: Any) -> None:
        ids = list(range(next_id[0], next_id[0] + 10))
        next_id[0] += 10
        with client.lock("events", ["hot"], owner="writer", ttl_s=30, wait_s=30) as lock:
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(
                    f'INSERT INTO "{table}" VALUES (%s, 0, %s)', [(i, f"x{i}") for i in ids]
                )
            v = client.commit(
                "events",
                lock=lock,
                updates=[{"source": "hot", "state": {"as_of": server_now(conn)}}],
            )
            committed.append((v, ids))

    def mover_body(conn: Any) -> None:
        with client.lock("events", ["hot", "cold"], owner="mover", ttl_s=60, wait_s=30) as lock:
            rows = conn.execute(f'SELECT id, p, payload FROM "{table}" ORDER BY id').fetchall()
            conn.commit()
            if not rows:
                time.sleep(0.05)
                return
            cold.append(
                pa.Table.from_pylist(
                    [{"id": r[0], "p": r[1], "payload": r[2]} for r in rows], schema=ARROW
                )
            )
            with conn.transaction():
                conn.execute(f'DELETE FROM "{table}" WHERE id = ANY(%s)', ([r[0] for r in rows],))
            client.commit(
                "events",
                lock=lock,
                summary={"operation": "pg-cold-move"},
                updates=[
                    {
                        "source": "cold",
                        "state": {"snapshot_id": cold.current_snapshot().snapshot_id},
                    },
                    {"source": "hot", "state": {"as_of": server_now(conn)}},
                ],
            )
            stats["moves"] += 1

    def with_conn(body: Callable[[Any], None]) -> Callable[[], None]:
        conn = psycopg.connect(pg_dsn)

        def step() -> None:
            if run.stop.is_set():
                conn.close()
                return
            body(conn)

        return step

    seen: dict[int, list[int]] = {}

    def reader() -> None:
        version = client.pinned_version(client.flight_info("events"))
        ids = client.read("events", version=version, columns=["id"]).column("id").to_pylist()
        assert len(ids) == len(set(ids)), f"duplicates at version {version}"
        expected = {i for v, batch in list(committed) if v <= version for i in batch}
        assert set(ids) == expected, (
            f"version {version}: missing {sorted(expected - set(ids))[:5]}, extra {sorted(set(ids) - expected)[:5]}"
        )
        if version in seen:
            assert sorted(ids) == seen[version]
        seen.setdefault(version, sorted(ids))
        stats["reads"] += 1

    run.loop("writer", with_conn(writer_body))
    run.loop("mover", with_conn(mover_body))
    run.loop("reader-1", reader)
    run.loop("reader-2", reader)
    run.finish(SECONDS)
    assert stats["moves"] >= 2 and stats["reads"] >= 4, stats
    for v, ids in list(seen.items())[:5]:
        assert (
            sorted(client.read("events", version=v, columns=["id"]).column("id").to_pylist()) == ids
        )
