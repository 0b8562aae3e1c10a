"""Medium example: keyed updates flow Kafka -> Postgres (upserts) -> Iceberg; the primary-key
view shows the latest version of every log at every table version.

Both movers touch the Postgres source, so each takes the harness lock on it: they queue, and
neither ever sees the other's half-done work.
"""

from __future__ import annotations

import logging

import psycopg
import pyarrow as pa
from _env import environment

from pipelines.mover import Mover
from planners.postgres.versioning import enable_versioning, server_now

log = logging.getLogger("medium")
SCHEMA = pa.schema(
    [("id", pa.int64()), ("msg", pa.string()), ("rev", pa.int64()), ("_deleted", pa.bool_())]
)

with environment() as env:
    c = env.client
    topic = env.topic("updates", partitions=1)
    with psycopg.connect(env.pg_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE logs (id bigint PRIMARY KEY, msg text, rev bigint, _deleted boolean)"
        )
        enable_versioning(conn, "logs")
        as_of = server_now(conn)
    env.iceberg.create_table("db.logs_cold", schema=SCHEMA)
    c.create_table("logs", SCHEMA, primary_key=["id"], properties={"dedupe.order_by": "rev"})
    c.commit(
        "logs",
        add_sources=[
            {
                "name": "kafka",
                "kind": "kafka",
                "config": {
                    "bootstrap_servers": env.bootstrap,
                    "topic": topic,
                    "partition": 0,
                    "key_column": "id",
                },
                "state": {"low": 0, "high": 0},
            },
            {
                "name": "postgres",
                "kind": "postgres",
                "config": {"dsn": env.pg_dsn, "table": "logs"},
                "state": {"as_of": as_of},
            },
            {
                "name": "iceberg",
                "kind": "iceberg",
                "config": env.iceberg_source("db.logs_cold"),
                "state": {"snapshot_id": None},
            },
        ],
    )
    to_pg = Mover(c, "logs", "kafka", "postgres")
    to_cold = Mover(c, "logs", "postgres", "iceberg")
    rev = 0
    model: dict[int, str] = {}
    offset = 0
    for round_ in range(4):
        batch = []
        for i in range(20):
            rev += 1
            key = (round_ * 7 + i) % 15
            if rev % 9 == 0:
                batch.append((0, str(key).encode(), None))  # a tombstone deletes the log
                model.pop(key, None)
            else:
                batch.append((0, str(key).encode(), {"msg": f"rev {rev}", "rev": rev}))
                model[key] = f"rev {rev}"
        env.produce(topic, batch)
        offset += len(batch)
        with c.lock("logs", ["kafka"], owner="ingester", wait_s=30) as lk:
            c.commit(
                "logs",
                lock=lk,
                updates=[
                    {
                        "source": "kafka",
                        "state": {
                            "low": c.describe("logs").source("kafka").state["low"],
                            "high": offset,
                        },
                    }
                ],
            )
        assert (
            dict(
                zip(
                    *c.read("logs", dedupe=True, columns=["id", "msg"]).to_pydict().values(),
                    strict=True,
                )
            )
            == model
        )
        to_pg.run_once()
        assert (
            dict(
                zip(
                    *c.read("logs", dedupe=True, columns=["id", "msg"]).to_pydict().values(),
                    strict=True,
                )
            )
            == model
        )
        if round_ % 2:
            to_cold.run_once()
            assert (
                dict(
                    zip(
                        *c.read("logs", dedupe=True, columns=["id", "msg"]).to_pydict().values(),
                        strict=True,
                    )
                )
                == model
            )
        log.info(
            "round %d: %d live logs, union of %d rows across kafka/postgres/iceberg",
            round_,
            len(model),
            c.read("logs").num_rows,
        )
    log.info("medium example: OK")
