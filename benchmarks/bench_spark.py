"""Spark against direct access, in the same run.

1. ``spark.read.format("harness-flight")`` vs ``spark.read.parquet`` on the same Parquet files,
   aggregating every column (so neither side can skip data), local[2].
2. Pipeline throughput: the Spark Kafka -> Iceberg flush (read through harness-flight, write
   Parquet, add_files, one commit) in rows/s.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from clients import HarnessClient
from flight_gateway.app import GatewayConfig, HarnessFlightServer
from flight_gateway.catalog import Catalog
from flight_gateway.local.kafka import local_broker


def run(quick: bool = False) -> list[dict]:
    from pyspark.sql import SparkSession

    from pipelines.spark_jobs import move
    from spark_datasource import register

    rows_n = 2_000_000 if quick else 20_000_000
    files_n = 4 if quick else 8
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    out: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        rng = np.random.default_rng(0)
        per = rows_n // files_n
        (tmp / "data").mkdir()
        for i in range(files_n):
            t = pa.table(
                {
                    "id": np.arange(i * per, (i + 1) * per, dtype=np.int64),
                    "a": rng.integers(0, 1000, per),
                    "b": rng.random(per),
                }
            )
            pq.write_table(t, tmp / "data" / f"part-{i}.parquet")
        catalog = Catalog(f"sqlite:///{tmp / 'catalog.db'}")
        server = HarnessFlightServer(
            catalog, GatewayConfig(port=0, allow_anonymous=True, ticket_key="bench-ticket-key-0123")
        )
        threading.Thread(target=server.serve, daemon=True).start()
        uri = f"grpc://127.0.0.1:{server.port}"
        client = HarnessClient(uri)
        client.create_table(
            "t",
            [
                {"name": "id", "type": "int64"},
                {"name": "a", "type": "int64"},
                {"name": "b", "type": "double"},
            ],
        )
        client.add_source(
            "t",
            "f",
            "files",
            config={"root": str(tmp / "data"), "direct": True},
            state={"files": [f"part-{i}.parquet" for i in range(files_n)]},
        )
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("harness-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.memory", "4g")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)

        def agg(df) -> None:
            r = df.selectExpr("count(*) AS n", "sum(id)", "sum(a)", "sum(b)").first()
            assert r.n == per * files_n

        def best(fn, repeats: int = 3) -> float:
            t = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                t = min(t, time.perf_counter() - t0)
            return t

        from spark_datasource.native import read_native

        harness = spark.read.format("harness-flight").option("uri", uri).option("table", "t").load()
        native = spark.read.parquet(str(tmp / "data"))
        planned = read_native(spark, uri, "t")
        agg(harness), agg(native), agg(planned)  # warm up every path (JVM, Python workers)
        t_native = best(lambda: agg(native))
        t_harness = best(lambda: agg(harness))
        t_scan = best(lambda: agg(planned))
        # The native path as a caller uses it: plan (one gateway call) and scan, every time.
        t_planned = best(lambda: agg(read_native(spark, uri, "t")))
        n = per * files_n
        out.append(
            {
                "case": f"Spark scan {n:,} rows x 3 cols, spark.read.parquet",
                "value": round(n / t_native),
                "unit": "rows/s",
                "ratio": 1.0,
                "ratio_vs": "spark.read.parquet",
            }
        )
        out.append(
            {
                "case": f"Spark scan {n:,} rows x 3 cols, harness-flight",
                "value": round(n / t_harness),
                "unit": "rows/s",
                "ratio": round(t_native / t_harness, 3),
                "ratio_vs": "spark.read.parquet",
            }
        )
        out.append(
            {
                "case": f"Spark scan {n:,} rows x 3 cols, native path (scan of a planned read)",
                "value": round(n / t_scan),
                "unit": "rows/s",
                "ratio": round(t_native / t_scan, 3),
                "ratio_vs": "spark.read.parquet",
            }
        )
        out.append(
            {
                "case": f"Spark scan {n:,} rows x 3 cols, native path (plan + scan)",
                "value": round(n / t_planned),
                "unit": "rows/s",
                "ratio": round(t_native / t_planned, 3),
                "ratio_vs": "spark.read.parquet",
            }
        )

        with local_broker() as bootstrap:
            from confluent_kafka import Producer
            from confluent_kafka.admin import AdminClient, NewTopic
            from pyiceberg.catalog.sql import SqlCatalog

            m = 50_000 if quick else 500_000
            admin = AdminClient({"bootstrap.servers": bootstrap})
            for f in admin.create_topics(
                [NewTopic("flush", num_partitions=1, replication_factor=1)]
            ).values():
                f.result(30)
            p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
            for i in range(m):
                p.produce(
                    "flush", value=json.dumps({"id": i, "name": f"n{i}"}).encode(), partition=0
                )
                if i % 50_000 == 0:
                    p.poll(0)
            p.flush(60)
            (tmp / "wh").mkdir()
            props = {"uri": f"sqlite:///{tmp / 'ice.db'}", "warehouse": f"file://{tmp / 'wh'}"}
            ice = SqlCatalog("default", **props)
            ice.create_namespace("db")
            ice.create_table(
                "db.flush", schema=pa.schema([("id", pa.int64()), ("name", pa.string())])
            )
            client.create_table(
                "k", [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}]
            )
            client.commit(
                "k",
                add_sources=[
                    {
                        "name": "k0",
                        "kind": "kafka",
                        "config": {
                            "bootstrap_servers": bootstrap,
                            "topic": "flush",
                            "partition": 0,
                            "max_task_messages": m // 4,
                        },
                        "state": {"low": 0, "high": m},
                    },
                    {
                        "name": "cold",
                        "kind": "iceberg",
                        "config": {"catalog": {"type": "sql", **props}, "identifier": "db.flush"},
                        "state": {"snapshot_id": None},
                    },
                ],
            )
            t0 = time.perf_counter()
            result = move(spark, uri, client, "k", "k0", "cold")
            elapsed = time.perf_counter() - t0
            assert result.rows == m
            out.append(
                {
                    "case": f"Spark flush Kafka -> Iceberg, {m:,} messages",
                    "value": round(m / elapsed),
                    "unit": "rows/s",
                    "ratio": 1.0,
                    "ratio_vs": "(absolute)",
                }
            )
        spark.stop()
        client.close()
        server.shutdown()
        catalog.close()
    return out
