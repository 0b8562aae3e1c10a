"""Simple example: logs in Kafka partitions, flushed to Iceberg, read as one table.

Consumers commit the highest offset per partition every few hundred milliseconds; a flusher
moves each partition's [low, high) to Iceberg and commits {Iceberg snapshot, low = high} at
once. Readers see every log exactly once, whatever they read and whenever.
"""

from __future__ import annotations

import logging
import threading

import pyarrow as pa
from _env import environment

from pipelines.ingest import KafkaIngester
from pipelines.mover import Mover

log = logging.getLogger("simple")
SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.int32()), ("msg", pa.string())])

with environment() as env:
    c = env.client
    topic = env.topic("logs", partitions=2)
    env.iceberg.create_table("db.logs", schema=SCHEMA)
    c.create_table("logs", SCHEMA, partition_by=["p"])
    c.commit(
        "logs",
        add_sources=[
            *(
                {
                    "name": f"kafka-{p}",
                    "kind": "kafka",
                    "partition": {"p": p},
                    "config": {"bootstrap_servers": env.bootstrap, "topic": topic, "partition": p},
                    "state": {"low": 0, "high": 0},
                }
                for p in (0, 1)
            ),
            {
                "name": "iceberg",
                "kind": "iceberg",
                "config": env.iceberg_source("db.logs"),
                "state": {"snapshot_id": None},
            },
        ],
    )
    ingester = KafkaIngester(
        c, "logs", env.bootstrap, topic, {0: "kafka-0", 1: "kafka-1"}, interval_s=0.2
    )
    stop = threading.Event()
    worker = threading.Thread(target=ingester.run, args=(stop,))
    worker.start()
    flushers = [Mover(c, "logs", f"kafka-{p}", "iceberg") for p in (0, 1)]
    next_id = 0
    for round_ in range(3):
        env.produce(
            topic,
            [
                (i % 2, None, {"id": i, "p": i % 2, "msg": f"log {i}"})
                for i in range(next_id, next_id + 100)
            ],
        )
        next_id += 100
        while c.read("logs").num_rows < next_id:  # the ingester makes them visible shortly
            pass
        for f in flushers:
            f.run_once()
        ids = c.read("logs", columns=["id"]).column("id").to_pylist()
        assert sorted(ids) == list(range(next_id)), "every log exactly once"
        meta = c.describe("logs")
        log.info(
            "round %d: %d logs, all exactly once; kafka lows %s",
            round_,
            len(ids),
            {s.name: s.state.get("low") for s in meta.sources if s.kind == "kafka"},
        )
    stop.set()
    worker.join()
    log.info("simple example: OK")
