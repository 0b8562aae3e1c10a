"""Hot sources against direct access, in the same run.

1. A Kafka offset range read through the gateway vs confluent-kafka + pyarrow.json directly
   (assign, bounded consume, one bulk JSON decode) — goal >= 0.9.
2. A system-versioned Postgres table read as of a timestamp through the gateway vs psycopg
   (fetchall, then Arrow) and vs the ADBC driver, running the same SQL — goal >= 1.0 of psycopg.
3. Freshness: time from produce to visible in a gateway read, with a KafkaIngester committing
   every 100 ms — goal p99 <= 1 s.
4. Small pinned Postgres reads (1,000 rows) from 1 and 8 clients: reads/s through the gateway
   vs ADBC on a connection each client keeps, running the same SQL; through the gateway with
   its pinned-rows cache off (``planners.postgres.cache``: every read asks the server); and
   with the cache and its connection pool off (``planners.postgres.pool``: every read
   connects).
"""

from __future__ import annotations

import io
import json
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson

from benchmarks.services import postgres_database
from clients import HarnessClient
from flight_gateway.app import GatewayConfig, HarnessFlightServer
from flight_gateway.catalog import Catalog
from flight_gateway.local.kafka import local_broker
from pipelines.ingest import KafkaIngester

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])


def _best(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _kafka(client: HarnessClient, bootstrap: str, n: int, repeats: int) -> list[dict]:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"bench-{uuid.uuid4().hex[:6]}"
    for f in admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1)]
    ).values():
        f.result(30)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000}
    )
    for i in range(n):
        producer.produce(
            topic,
            value=json.dumps({"id": i, "name": f"name-{i}", "amount": i * 0.25}).encode(),
            partition=0,
        )
        if i % 50_000 == 0:
            producer.poll(0)
    producer.flush(60)
    cfg = {"bootstrap_servers": bootstrap, "topic": topic, "partition": 0}
    client.create_table("k", [{"name": f.name, "type": str(f.type)} for f in SCHEMA])
    client.add_source("k", "k0", "kafka", config=cfg, state={"low": 0, "high": n})

    def direct() -> None:
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": uuid.uuid4().hex,
                "enable.auto.commit": False,
                # at its best: by default librdkafka waits a second before fetching again
                # once its prefetch queue was full (100,000 messages)
                "fetch.queue.backoff.ms": 5,
            }
        )
        c.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        while len(values) < n:
            values += [
                m.value()
                for m in c.consume(min(65536, n - len(values)), timeout=1.0)
                if m.error() is None
            ]
        c.close()
        opts = pajson.ParseOptions(explicit_schema=SCHEMA)
        data = b"\n".join(values)
        t = pajson.read_json(
            io.BytesIO(data),
            parse_options=opts,
            read_options=pajson.ReadOptions(block_size=len(data) + 1),
        )
        assert t.num_rows == n

    def gateway() -> None:
        assert client.read("k").num_rows == n

    t_direct, t_gw = _best(direct, repeats), _best(gateway, repeats)
    return [
        {
            "case": f"Kafka {n:,} JSON messages, confluent-kafka + pyarrow",
            "value": round(n / t_direct),
            "unit": "rows/s",
            "ratio": 1.0,
            "ratio_vs": "direct",
        },
        {
            "case": f"Kafka {n:,} JSON messages, gateway",
            "value": round(n / t_gw),
            "unit": "rows/s",
            "ratio": round(t_direct / t_gw, 3),
            "ratio_vs": "direct",
        },
    ]


def _postgres(client: HarnessClient, dsn: str, n: int, repeats: int) -> list[dict]:
    import adbc_driver_postgresql.dbapi as adbc
    import psycopg

    from planners.postgres.versioning import enable_versioning, server_now
    from planners.predicates.sql import postgres_literal

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench (id bigint PRIMARY KEY, name text, amount float8)")
        enable_versioning(conn, "bench")
        conn.execute(
            "INSERT INTO bench SELECT g, 'name-' || g, g * 0.25 FROM generate_series(1, %s) g", (n,)
        )
        conn.execute("VACUUM ANALYZE bench")
        as_of = server_now(conn)
    client.create_table("pg", [{"name": f.name, "type": str(f.type)} for f in SCHEMA])
    client.add_source(
        "pg", "p", "postgres", config={"dsn": dsn, "table": "bench"}, state={"as_of": as_of}
    )
    client.create_table("pg1", [{"name": f.name, "type": str(f.type)} for f in SCHEMA])
    client.add_source(
        "pg1",
        "p",
        "postgres",
        config={"dsn": dsn, "table": "bench", "tasks": 1},
        state={"as_of": as_of},
    )
    sql = (
        'SELECT "amount", "id", "name" FROM bench WHERE sys_period @> {p}::timestamptz '
        'UNION ALL SELECT "amount", "id", "name" FROM bench_history WHERE sys_period @> {p}::timestamptz'
    )

    def via_psycopg() -> None:
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(sql.format(p="%(t)s"), {"t": as_of}).fetchall()
        cols = list(zip(*rows, strict=True))
        t = pa.table({"amount": cols[0], "id": cols[1], "name": cols[2]})
        assert t.num_rows == n

    def via_adbc() -> None:
        # The as-of instant as a literal: ADBC streams a query without parameters through
        # binary COPY, and buffers a parameterised one whole (3x slower): compare with its best.
        with adbc.connect(dsn) as conn, conn.cursor() as cur:
            cur.execute(sql.format(p=postgres_literal(as_of)))
            assert cur.fetch_arrow_table().num_rows == n

    def gateway() -> None:
        assert client.read("pg").num_rows == n

    def gateway_one_task() -> None:
        assert client.read("pg1").num_rows == n

    t_psy, t_adbc, t_gw, t_one = (
        _best(via_psycopg, repeats),
        _best(via_adbc, repeats),
        _best(gateway, repeats),
        _best(gateway_one_task, repeats),
    )
    tasks = len(client.flight_info("pg").endpoints)
    return [
        {
            "case": f"Postgres {n:,} rows, psycopg fetchall -> Arrow",
            "value": round(n / t_psy),
            "unit": "rows/s",
            "ratio": 1.0,
            "ratio_vs": "psycopg",
        },
        {
            "case": f"Postgres {n:,} rows, ADBC driver",
            "value": round(n / t_adbc),
            "unit": "rows/s",
            "ratio": round(t_psy / t_adbc, 3),
            "ratio_vs": "psycopg",
        },
        {
            "case": f"Postgres {n:,} rows, gateway",
            "value": round(n / t_gw),
            "unit": "rows/s",
            "ratio": round(t_psy / t_gw, 3),
            "ratio_vs": "psycopg",
        },
        {
            "case": f"Postgres {n:,} rows, gateway vs ADBC ({tasks} key-range tasks)",
            "value": round(n / t_gw),
            "unit": "rows/s",
            "ratio": round(t_adbc / t_gw, 3),
            "ratio_vs": "ADBC",
        },
        {
            "case": f"Postgres {n:,} rows, gateway vs ADBC (one task)",
            "value": round(n / t_one),
            "unit": "rows/s",
            "ratio": round(t_adbc / t_one, 3),
            "ratio_vs": "ADBC",
        },
    ]


def _postgres_small(client: HarnessClient, location: str, dsn: str, seconds: float) -> list[dict]:
    import adbc_driver_postgresql.dbapi as adbc
    import psycopg

    from planners.postgres import pool
    from planners.postgres.cache import CACHE
    from planners.postgres.versioning import enable_versioning, server_now
    from planners.predicates.sql import postgres_literal

    n = 1_000
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE small (id bigint PRIMARY KEY, name text, amount float8)")
        enable_versioning(conn, "small")
        conn.execute(
            "INSERT INTO small SELECT g, 'name-' || g, g * 0.25 FROM generate_series(1, %s) g",
            (n,),
        )
        as_of = server_now(conn)
    client.create_table("small", [{"name": f.name, "type": str(f.type)} for f in SCHEMA])
    client.add_source(
        "small", "p", "postgres", config={"dsn": dsn, "table": "small"}, state={"as_of": as_of}
    )
    p = postgres_literal(as_of)
    sql = (
        f'SELECT "amount", "id", "name" FROM small WHERE sys_period @> {p}::timestamptz UNION '
        f'ALL SELECT "amount", "id", "name" FROM small_history WHERE sys_period @> {p}::timestamptz'
    )

    opened: list[Any] = []  # each client's connection, closed at the end

    def direct() -> Callable[[], None]:
        conn = adbc.connect(dsn, autocommit=True)
        opened.append(conn)

        def read() -> None:
            with conn.cursor() as cur:
                cur.execute(sql)
                assert cur.fetch_arrow_table().num_rows == n

        return read

    def gateway() -> Callable[[], None]:
        c = HarnessClient(location)
        opened.append(c)

        def read() -> None:
            assert c.read("small").num_rows == n

        return read

    rows = []
    for clients in (1, 8):
        cached = CACHE.max_bytes
        try:
            adbc_rate = _rate(direct, clients, seconds)
            gw_rate = _rate(gateway, clients, seconds)
            CACHE.max_bytes = 0  # nothing kept: every read asks the server
            CACHE.clear()
            uncached = _rate(gateway, clients, seconds)
            for each in (pool.ADBC, pool.PLANNING):  # connections closed, never given back
                each.clear()
                each.give = each.discard  # type: ignore[method-assign]
            unpooled = _rate(gateway, clients, seconds)
        finally:
            CACHE.max_bytes = cached
            for each in (pool.ADBC, pool.PLANNING):
                each.__dict__.pop("give", None)
            for resource in opened:
                resource.close()
            opened.clear()
        cases = (
            ("gateway", gw_rate),
            ("gateway, cache off", uncached),
            ("gateway, cache and pool off", unpooled),
        )
        for case, rate in cases:
            rows.append(
                {
                    "case": f"Postgres {n:,}-row reads, {clients} clients, {case}",
                    "value": round(rate, 1),
                    "unit": "reads/s",
                    "ratio": round(rate / adbc_rate, 3),
                    "ratio_vs": f"ADBC on a kept connection ({adbc_rate:.0f} reads/s)",
                }
            )
    return rows


def _rate(make: Callable[[], Callable[[], None]], clients: int, seconds: float) -> float:
    """Reads per second of ``clients`` threads, each running its own ``make()`` in a loop."""
    readers = [make() for _ in range(clients)]
    for read in readers:
        read()  # warm: connections, caches
    done = [0] * clients
    stop = time.perf_counter() + seconds

    def loop(i: int) -> None:
        while time.perf_counter() < stop:
            readers[i]()
            done[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - start)


def _freshness(client: HarnessClient, bootstrap: str, samples: int) -> list[dict]:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"fresh-{uuid.uuid4().hex[:6]}"
    for f in admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1)]
    ).values():
        f.result(30)
    client.create_table("fresh", [{"name": f.name, "type": str(f.type)} for f in SCHEMA])
    client.add_source(
        "fresh",
        "k0",
        "kafka",
        config={"bootstrap_servers": bootstrap, "topic": topic, "partition": 0},
        state={"low": 0, "high": 0},
    )
    ingester = KafkaIngester(
        client, "fresh", bootstrap, topic, {0: "k0"}, group_id="bench", interval_s=0.1
    )
    stop = threading.Event()
    worker = threading.Thread(target=ingester.run, args=(stop,), daemon=True)
    worker.start()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    latencies = []
    for i in range(samples):
        t0 = time.perf_counter()
        producer.produce(
            topic, value=json.dumps({"id": i, "name": "x", "amount": 0.0}).encode(), partition=0
        )
        producer.flush(10)
        while client.read("fresh", filter=f"id = {i}").num_rows == 0:
            if time.perf_counter() - t0 > 10:
                raise RuntimeError(f"message {i} not visible after 10 s")
        latencies.append(time.perf_counter() - t0)
        time.sleep(0.05)
    stop.set()
    worker.join(10)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    return [
        {
            "case": f"freshness p50 ({samples} messages, ingester every 100 ms)",
            "value": round(statistics.median(latencies), 3),
            "unit": "s",
            "ratio": round(1.0 / statistics.median(latencies), 2),
            "ratio_vs": "1 s goal",
        },
        {
            "case": f"freshness p99 ({samples} messages, ingester every 100 ms)",
            "value": round(p99, 3),
            "unit": "s",
            "ratio": round(1.0 / p99, 2),
            "ratio_vs": "1 s goal",
        },
    ]


def run(quick: bool = False) -> list[dict]:
    kafka_n = 50_000 if quick else 400_000
    pg_n = 200_000 if quick else 2_000_000
    repeats = 2 if quick else 3
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        catalog = Catalog(f"sqlite:///{Path(tmp) / 'catalog.db'}")
        server = HarnessFlightServer(
            catalog, GatewayConfig(port=0, allow_anonymous=True, ticket_key="bench-ticket-key-0123")
        )
        threading.Thread(target=server.serve, daemon=True).start()
        location = f"grpc://127.0.0.1:{server.port}"
        client = HarnessClient(location)
        with local_broker() as bootstrap:
            rows += _kafka(client, bootstrap, kafka_n, repeats)
            rows += _freshness(client, bootstrap, 20 if quick else 100)
        with postgres_database() as dsn:
            if dsn:
                rows += _postgres(client, dsn, pg_n, repeats)
                rows += _postgres_small(client, location, dsn, 3.0 if quick else 10.0)
        client.close()
        server.shutdown()
        catalog.close()
    return rows
