"""`make demo`: the gateway on embedded defaults, one table over Parquet + Iceberg + DuckLake.

Everything lives under ./demo-data: a SQLite harness catalog, Parquet files, a pyiceberg
SqlCatalog with a local warehouse, and a DuckLake with SQLite metadata. A gateway is started on
a free loopback port; pandas and Polars read through the Python client.
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from clients import HarnessClient
from flight_gateway.app import GatewayConfig, HarnessFlightServer
from flight_gateway.catalog import Catalog
from planners.ducklake import connect as ducklake_connect

log = logging.getLogger("demo")
SCHEMA = pa.schema([("id", pa.int64()), ("level", pa.string()), ("msg", pa.string())])


def batch(start: int, n: int, level: str) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table(
        {"id": ids, "level": [level] * n, "msg": [f"{level.lower()} #{i}" for i in ids]},
        schema=SCHEMA,
    )


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("flight_gateway").setLevel(logging.WARNING)
    root = Path("demo-data").resolve()
    shutil.rmtree(root, ignore_errors=True)
    (root / "files").mkdir(parents=True)
    (root / "warehouse").mkdir()

    catalog = Catalog(f"sqlite:///{root / 'harness.db'}")
    # Anonymous local development, but sources may reach only the demo's own data directory and
    # services on this machine (docs/security.md).
    config = GatewayConfig(
        catalog=catalog.url,
        port=0,
        allow_anonymous=True,
        ticket_key="demo-only-ticket-key",
        reach={"paths": [str(root)], "hosts": ["127.0.0.1"]},
    )
    server = HarnessFlightServer(catalog, config)
    threading.Thread(target=server.serve, daemon=True).start()
    client = HarnessClient(f"grpc://127.0.0.1:{server.port}")
    log.info("gateway listening on grpc://127.0.0.1:%d", server.port)

    # Cold data in three formats.
    pq.write_table(batch(0, 1000, "ERROR"), root / "files" / "part-0.parquet")
    from pyiceberg.catalog.sql import SqlCatalog

    ice_props = {
        "uri": f"sqlite:///{root / 'iceberg.db'}",
        "warehouse": f"file://{root / 'warehouse'}",
    }
    ice = SqlCatalog("default", **ice_props)
    ice.create_namespace("db")
    events = ice.create_table("db.events", schema=SCHEMA)
    events.append(batch(10_000, 500, "INFO"))
    lake_cfg = {
        "metadata": f"sqlite:{root / 'lake.sqlite'}",
        "data_path": f"{root / 'lake'}/",
        "table": "debug",
    }
    con = ducklake_connect(lake_cfg, read_only=False)
    con.execute("CREATE TABLE lake.debug (id BIGINT, level VARCHAR, msg VARCHAR)")
    con.execute(
        "INSERT INTO lake.debug SELECT i, 'DEBUG', 'debug #' || i FROM range(20000, 20200) r(i)"
    )
    lake_snapshot = con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0]
    con.close()

    client.create_table("logs", SCHEMA, partition_by=["level"])
    v1 = client.commit(
        "logs",
        add_sources=[
            {
                "name": "errors",
                "kind": "files",
                "partition": {"level": "ERROR"},
                # direct: clients that ask may read these files themselves (data plane)
                "config": {"format": "parquet", "root": str(root / "files"), "direct": True},
                "state": {"files": ["part-0.parquet"]},
            },
            {
                "name": "info",
                "kind": "iceberg",
                "partition": {"level": "INFO"},
                "config": {
                    "catalog": {"type": "sql", **ice_props},
                    "identifier": "db.events",
                    "direct": True,
                },
                "state": {"snapshot_id": events.current_snapshot().snapshot_id},
            },
            {
                "name": "debug",
                "kind": "ducklake",
                "partition": {"level": "DEBUG"},
                "config": lake_cfg,
                "state": {"snapshot_id": lake_snapshot},
            },
        ],
    )
    log.info("version %d: table 'logs' = Parquet(ERROR) + Iceberg(INFO) + DuckLake(DEBUG)", v1)

    # A writer lands more data and commits the new file list and Iceberg snapshot at once.
    pq.write_table(batch(1000, 250, "ERROR"), root / "files" / "part-1.parquet")
    events.append(batch(10_500, 100, "INFO"))
    v2 = client.commit(
        "logs",
        updates=[
            {"source": "errors", "state": {"files": ["part-0.parquet", "part-1.parquet"]}},
            {"source": "info", "state": {"snapshot_id": events.current_snapshot().snapshot_id}},
        ],
    )
    log.info(
        "version %d: +250 ERROR rows (new Parquet file) and +100 INFO rows (new Iceberg snapshot)",
        v2,
    )

    df = client.to_pandas("logs")
    log.info(
        "\npandas, latest version: %d rows\n%s", len(df), df.groupby("level").size().to_string()
    )
    old = client.to_pandas("logs", version=v1)
    log.info(
        "\npandas, time travel to version %d: %d rows\n%s",
        v1,
        len(old),
        old.groupby("level").size().to_string(),
    )

    flt = "level IN ('ERROR', 'DEBUG') AND id BETWEEN 990 AND 1004"
    pl_df = client.to_polars("logs", columns=["id", "msg"], filter=flt)
    log.info("\nPolars, filter %r:\n%s", flt, pl_df)

    info = client.flight_info("logs", filter="level = 'INFO' AND id >= 10550")
    meta = json.loads(info.app_metadata)
    log.info(
        "\nsource pruning for level = 'INFO': %s",
        {s["name"]: "pruned" if s["pruned"] else f"{s['tasks']} task(s)" for s in meta["sources"]},
    )
    log.info("rows: %d", client.read("logs", filter="level = 'INFO' AND id >= 10550").num_rows)

    # The data plane: the gateway plans and signs; the client reads the cold files itself.
    info = client.flight_info("logs", direct=True)
    direct = sum(client.direct_task(ep) is not None for ep in info.endpoints)
    via_flight = client.read("logs").sort_by("id")
    via_direct = client.read("logs", direct=True).sort_by("id")
    log.info(
        "\ndirect read: %d of %d endpoints read by the client itself (Parquet + Iceberg files), "
        "DuckLake through the gateway; same %d rows as the Flight read: %s",
        direct,
        len(info.endpoints),
        via_direct.num_rows,
        via_direct.equals(via_flight),
    )

    hot_and_cold(client, ice, root)

    client.close()
    server.shutdown()
    catalog.close()


def hot_and_cold(client: HarnessClient, ice: Any, root: Path) -> None:
    """Kafka (hot) + Iceberg (cold) as one table: ingest, flush, and freshness."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from flight_gateway.local.kafka import local_broker
    from pipelines.ingest import KafkaIngester
    from planners.kafka import read_offsets
    from planners.kind import ColumnSpec

    with local_broker() as bootstrap:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.create_topics(
            [NewTopic("events", num_partitions=1, replication_factor=1)]
        ).values():
            f.result(30)
        cold = ice.create_table("db.events_cold", schema=SCHEMA)
        kafka_cfg = {"bootstrap_servers": bootstrap, "topic": "events", "partition": 0}
        client.create_table("events", SCHEMA)
        client.commit(
            "events",
            add_sources=[
                {
                    "name": "kafka-0",
                    "kind": "kafka",
                    "config": kafka_cfg,
                    "state": {"low": 0, "high": 0},
                },
                {
                    "name": "cold",
                    "kind": "iceberg",
                    "config": {
                        "catalog": {
                            "type": "sql",
                            "uri": f"sqlite:///{root / 'iceberg.db'}",
                            "warehouse": f"file://{root / 'warehouse'}",
                        },
                        "identifier": "db.events_cold",
                    },
                    "state": {"snapshot_id": None},
                },
            ],
        )
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})

        def send(producer: Any, start: int, n: int) -> None:
            for i in range(start, start + n):
                producer.produce(
                    "events",
                    value=json.dumps({"id": i, "level": "INFO", "msg": f"event {i}"}).encode(),
                    partition=0,
                )
            producer.flush(10)

        ingester = KafkaIngester(
            client, "events", bootstrap, "events", {0: "kafka-0"}, group_id="demo", interval_s=0.1
        )
        stop = threading.Event()
        worker = threading.Thread(target=ingester.run, args=(stop,), daemon=True)
        worker.start()
        send(producer, 0, 300)
        deadline = time.monotonic() + 15
        while client.read("events").num_rows < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
        log.info(
            "\nKafka + Iceberg table 'events': %d rows, all still in Kafka",
            client.read("events").num_rows,
        )

        # The mover: flush Kafka [low, high) to Iceberg and move low in ONE harness commit.
        with client.lock(
            "events", ["kafka-0", "cold"], owner="demo-mover", ttl_s=30, wait_s=10
        ) as lock:
            state = client.describe("events").source("kafka-0").state
            cols = [ColumnSpec(i + 1, f.name, str(f.type)) for i, f in enumerate(SCHEMA)]
            rows = read_offsets(
                kafka_cfg, state["low"], state["high"], cols, skip=state.get("skip", [])
            )
            cold.append(rows.cast(SCHEMA))
            v = client.commit(
                "events",
                lock=lock,
                updates=[
                    {
                        "source": "cold",
                        "state": {"snapshot_id": cold.current_snapshot().snapshot_id},
                    },
                    {"source": "kafka-0", "state": {"low": state["high"], "high": state["high"]}},
                ],
            )
        meta = json.loads(client.flight_info("events").app_metadata)
        df = client.to_pandas("events")
        log.info(
            "version %d after the flush: %d rows (no duplicates: %s), sources %s",
            v,
            len(df),
            df["id"].is_unique,
            [s["name"] for s in meta["sources"]],
        )

        t0 = time.monotonic()
        send(producer, 300, 10)
        while client.read("events").num_rows < 310 and time.monotonic() - t0 < 10:
            time.sleep(0.02)
        log.info(
            "10 new Kafka messages visible in a gateway read after %.2f s", time.monotonic() - t0
        )
        spark_part(client, "events")
        stop.set()
        worker.join(10)
        # Let the Kafka clients go before the broker stops, so they do not log reconnects.
        del producer, admin
        gc.collect()


def spark_part(client: HarnessClient, table: str) -> None:
    """Spark reads the same table through harness-flight, then runs one flush on Spark."""
    import os
    import sys

    from pyspark.sql import SparkSession

    from pipelines import spark_jobs
    from spark_datasource import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("harness-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    df = spark.read.format("harness-flight").option("uri", client.uri).option("table", table).load()
    by_source = client.read(table, columns=["id"]).num_rows
    log.info(
        "\nSpark: %d rows via harness-flight (client: %d); %d partitions",
        df.count(),
        by_source,
        df.rdd.getNumPartitions(),
    )
    from spark_datasource.native import read_native

    native = read_native(spark, client.uri, table)
    log.info(
        "Spark native path: %d rows (cold files through Spark's own Parquet reader, hot "
        "Kafka rows through harness-flight, one pinned version)",
        native.count(),
    )
    result = spark_jobs.move(spark, client.uri, client, table, "kafka-0", "cold")
    state = client.describe(table).source("kafka-0").state
    log.info(
        "Spark flush: %d rows Kafka -> Iceberg in version %s; kafka-0 is now %s; Spark still counts %d",
        result.rows,
        result.version,
        state,
        df.count(),
    )
    spark.stop()


if __name__ == "__main__":
    main()
