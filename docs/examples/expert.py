"""Expert example, as the manifesto writes it: N Kafka partitions -> N Postgres shards on N
servers -> N partitions of one Apache Paimon primary-key table; one source per partition at
every stage, two movers per partition, all running at once with no synchronisation between
partitions (each locks only its own partition's sources), while new data keeps arriving.

At every harness version the primary-key view equals a model of what was produced: movers only
relocate rows, so no version ever shows a row twice or misses one. Set HARNESS_PG_SHARDS to the
DSNs of N separate Postgres servers (the tests do); without it the shards share one server.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import psycopg
import pyarrow as pa
from _env import environment
from pypaimon import CatalogFactory, Schema

from pipelines.mover import Mover
from planners.postgres.versioning import enable_versioning, server_now

log = logging.getLogger("expert")
PARTITIONS = 3
ROUNDS = 4
SCHEMA = pa.schema(
    [
        pa.field("p", pa.int32(), nullable=False),
        pa.field("id", pa.int64(), nullable=False),
        ("msg", pa.string()),
        ("rev", pa.int64()),
    ]
)


def paimon_table(root: str) -> None:
    catalog = CatalogFactory.create({"warehouse": root})
    catalog.create_database("db", True)
    schema = Schema.from_pyarrow_schema(
        SCHEMA, partition_keys=["p"], primary_keys=["p", "id"], options={"bucket": "1"}
    )
    catalog.create_table("db.events", schema, False)


def partition_sources(env, topic: str, shards: list[str], warehouse: str) -> list[dict]:
    sources = []
    for p, dsn in enumerate(shards):
        name = f"events_{uuid.uuid4().hex[:6]}_{p}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                f"CREATE TABLE {name} (p int, id bigint, msg text, rev bigint, PRIMARY KEY (p, id))"
            )
            enable_versioning(conn, name)
            as_of = server_now(conn)
        kafka = {"bootstrap_servers": env.bootstrap, "topic": topic, "partition": p}
        paimon = {"warehouse": warehouse, "identifier": "db.events", "partition": {"p": p}}
        sources += [
            {
                "name": f"kafka-{p}",
                "kind": "kafka",
                "partition": {"p": p},
                "config": kafka,
                "state": {"low": 0, "high": 0},
            },
            {
                "name": f"pg-{p}",
                "kind": "postgres",
                "partition": {"p": p},
                "config": {"dsn": dsn, "table": name},
                "state": {"as_of": as_of},
            },
            {
                "name": f"paimon-{p}",
                "kind": "paimon",
                "partition": {"p": p},
                "config": paimon,
                "state": {"snapshot_id": None},
            },
        ]
    return sources


with environment() as env:
    c = env.client
    topic = env.topic("events", partitions=PARTITIONS)
    warehouse = str(env.root / "paimon")
    paimon_table(warehouse)
    shards = env.shards(PARTITIONS)
    c.create_table(
        "events",
        SCHEMA,
        partition_by=["p"],
        primary_key=["p", "id"],
        properties={"dedupe.order_by": "rev"},
    )
    c.commit("events", add_sources=partition_sources(env, topic, shards, warehouse))

    model: dict[tuple[int, int], int] = {}
    models: list[tuple[int, dict[tuple[int, int], int]]] = []  # (version, model then)
    failures: list[BaseException] = []
    done = threading.Event()
    rev = 0

    def ingest() -> None:
        """Each round, per partition: 60 messages, then a commit of that partition's new high
        offset, under the partition's lock (a mover holding it is waited for, never fought)."""
        global rev
        try:
            for r in range(ROUNDS):
                for p in range(PARTITIONS):
                    batch, changes = [], {}
                    for i in range(60):
                        rev += 1
                        key = (r * 37 + i) % 40  # keys repeat: updates the view must merge
                        batch.append((p, None, {"p": p, "id": key, "msg": f"r{rev}", "rev": rev}))
                        changes[(p, key)] = rev
                    env.produce(topic, batch)
                    with c.lock(
                        "events", [f"kafka-{p}"], owner="ingest", ttl_s=30, wait_s=60
                    ) as lk:
                        low = c.describe("events").source(f"kafka-{p}").state["low"]
                        version = c.commit(
                            "events",
                            lock=lk,
                            updates=[
                                {
                                    "source": f"kafka-{p}",
                                    "state": {"low": low, "high": (r + 1) * 60},
                                }
                            ],
                            summary={"operation": "ingest"},
                        )
                    model.update(changes)
                    models.append((version, dict(model)))
                time.sleep(0.05)
        except BaseException as e:
            failures.append(e)
        finally:
            done.set()

    moves = {"count": 0}

    def partition_worker(p: int) -> None:
        hot = Mover(c, "events", f"kafka-{p}", f"pg-{p}")
        cold = Mover(c, "events", f"pg-{p}", f"paimon-{p}")
        try:
            while True:
                finished = done.is_set()
                for mover in (hot, cold):
                    if mover.run_once().version is not None:
                        moves["count"] += 1
                if finished:
                    return
        except BaseException as e:  # any conflict would land here: there must be none
            failures.append(e)

    started = time.perf_counter()
    threads = [threading.Thread(target=ingest)]
    threads += [threading.Thread(target=partition_worker, args=(p,)) for p in range(PARTITIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    assert not failures, failures

    # Every version since the first ingest shows exactly the model of the last ingest before it.
    history = sorted(h.version for h in c.history("events"))
    checked = 0
    for version in history:
        known = [m for v, m in models if v <= version]
        if not known:
            continue
        view = c.read("events", version=version, dedupe=True, columns=["p", "id", "rev"])
        got = {(r["p"], r["id"]): r["rev"] for r in view.to_pylist()}
        assert got == known[-1], version
        checked += 1
    final = c.describe("events")
    assert all(final.source(f"kafka-{p}").state["low"] == ROUNDS * 60 for p in range(PARTITIONS))
    table = CatalogFactory.create({"warehouse": warehouse}).get_table("db.events")
    reader = table.new_read_builder()
    in_paimon = reader.new_read().to_arrow(reader.new_scan().plan().splits()).num_rows
    log.info(
        "%d partitions on %d Postgres servers: %d concurrent moves in %.2fs, 0 conflicts, "
        "0 retries; %d versions checked against the model; %d keys, %d rows now in Paimon",
        PARTITIONS,
        len(set(shards)),
        moves["count"],
        elapsed,
        checked,
        len(model),
        in_paimon,
    )
    log.info("expert example: OK")
