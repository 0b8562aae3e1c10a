"""Run by tests/engines/test_spark_iceberg.py with the pyspark 4.1 environment
(``flight_gateway.local.engines.spark_python``), not the project's: Spark with Iceberg's own
Spark runtime reads a table of the gateway's Iceberg REST face, latest and at a snapshot, and
prints the rows as JSON. Imports nothing of the project."""

import json
import sys

from pyspark.sql import SparkSession


def main() -> None:
    runtime, uri, table, snapshot = sys.argv[1:5]
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.jars", runtime)
        .config(
            "spark.sql.extensions",
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        )
        .config("spark.sql.catalog.harness", "org.apache.iceberg.spark.SparkCatalog")
        .config("spark.sql.catalog.harness.type", "rest")
        .config("spark.sql.catalog.harness.uri", uri)
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    try:
        latest = spark.sql(f"SELECT id, region FROM harness.harness.{table}").collect()
        old = spark.sql(
            f"SELECT id, region FROM harness.harness.{table} VERSION AS OF {snapshot}"
        ).collect()
        print(json.dumps({"latest": [list(r) for r in latest], "old": [list(r) for r in old]}))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
