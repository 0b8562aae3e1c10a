"""Spark with Apache Hudi's Spark bundle, driven over stdin/stdout: one JSON request per line,
one JSON answer per line. Run by ``flight_gateway.local.hudi.HudiSpark`` with the pyspark 3.5
environment of ``flight_gateway.local.engines`` (Hudi's bundle supports Spark up to 3.5), never
the project's: it imports nothing of the project.

Requests:
- ``{"op": "write", "path", "data", "operation", "table_type", "key", "precombine",
  "partition", "options"}``: the rows of the Parquet file ``data`` written to the Hudi table at
  ``path`` (created by the first write) with Hudi's ``operation`` (insert, upsert, delete,
  bulk_insert); answers ``{"instant": <the newest completed instant>}``.
- ``{"op": "read", "path", "instant", "out"}``: Spark's own snapshot read of the table at
  ``instant`` (Hudi's ``as.of.instant``; null: the latest), without Hudi's meta columns, written
  to the Parquet file ``out``; answers ``{"rows": n}``.
"""

import json
import sys
import traceback
from typing import Any

from pyspark.sql import SparkSession

#: Starts every answer line (Spark may print other lines to stdout).
MARK = "@@hudi "


def _spark(bundle: str) -> SparkSession:
    return (
        SparkSession.builder.master("local[2]")
        .config("spark.jars", bundle)
        .config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
        .config("spark.sql.extensions", "org.apache.spark.sql.hudi.HoodieSparkSessionExtension")
        .config("spark.kryo.registrator", "org.apache.spark.HoodieSparkKryoRegistrar")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )


def _latest_instant(spark: SparkSession, path: str) -> str:
    jvm: Any = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    storage = jvm.org.apache.hudi.hadoop.fs.HadoopFSUtils.getStorageConfWithCopy(conf)
    client = (
        jvm.org.apache.hudi.common.table.HoodieTableMetaClient.builder()
        .setConf(storage)
        .setBasePath(path)
        .build()
    )
    last = client.getActiveTimeline().filterCompletedInstants().lastInstant()
    return str(last.get().requestedTime())


def write(spark: SparkSession, req: dict) -> dict:
    df = spark.read.parquet(req["data"])
    options = {
        "hoodie.table.name": req.get("name", "t"),
        "hoodie.datasource.write.table.type": req.get("table_type", "COPY_ON_WRITE"),
        "hoodie.datasource.write.operation": req.get("operation", "insert"),
        "hoodie.datasource.write.recordkey.field": req.get("key", "id"),
        "hoodie.datasource.write.hive_style_partitioning": "true",
        "hoodie.metadata.enable": "false",
        "hoodie.insert.shuffle.parallelism": "2",
        "hoodie.upsert.shuffle.parallelism": "2",
        "hoodie.delete.shuffle.parallelism": "2",
        "hoodie.bulkinsert.shuffle.parallelism": "2",
    }
    if req.get("precombine"):
        options["hoodie.datasource.write.precombine.field"] = req["precombine"]
    if req.get("partition"):
        options["hoodie.datasource.write.partitionpath.field"] = req["partition"]
    else:
        options["hoodie.datasource.write.keygenerator.class"] = (
            "org.apache.hudi.keygen.NonpartitionedKeyGenerator"
        )
    options.update(req.get("options") or {})
    df.write.format("hudi").options(**options).mode("append").save(req["path"])
    return {"instant": _latest_instant(spark, req["path"])}


def read(spark: SparkSession, req: dict) -> dict:
    reader = spark.read.format("hudi")
    if req.get("instant"):
        reader = reader.option("as.of.instant", req["instant"])
    df = reader.load(req["path"])
    df = df.select([c for c in df.columns if not c.startswith("_hoodie_")])
    df.coalesce(1).write.mode("overwrite").parquet(req["out"])
    return {"rows": df.count()}


def _send(answer: dict) -> None:
    """One answer line on stdout: the protocol's channel, not a log."""
    sys.stdout.write(MARK + json.dumps(answer) + "\n")
    sys.stdout.flush()


def main() -> None:
    spark = _spark(sys.argv[1])
    _send({"ready": True})
    ops = {"write": write, "read": read}
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            answer = ops[req["op"]](spark, req)
        except Exception as e:  # the caller gets the error; the worker stays up
            answer = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-4000:]}
        _send(answer)
    spark.stop()


if __name__ == "__main__":
    main()
