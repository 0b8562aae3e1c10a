"""Data pipelines on Spark: executors move the data, the gateway commits once.

- ``move`` (command line ``flush`` for a Kafka source, ``cold-move`` for another hot source):
  stage a write into the cold source (``begin_write``), read the hot source's rows at the
  pinned version through ``harness-flight`` on the executors, write them there as Parquet, and
  hand the files to the gateway's ``harness.move``, which adopts them into the cold source,
  takes the rows out of the hot one and commits both in one relocation commit (idempotency and
  the finishing of interrupted moves are the gateway's: ``pipelines.mover``).
- ``compact``: rewrite a files or Iceberg source as fewer, larger files in one commit; readers
  pinned to older versions keep reading the old files.

Run as ``python -m pipelines.spark_jobs flush|cold-move|compact --uri ... --table ...`` or with
``spark-submit``.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from clients import HarnessClient
from flight_gateway.protocol import operations as ops
from pipelines.compaction import filesystem, rewrite_source
from pipelines.mover import Mover, MoveResult

log = logging.getLogger(__name__)


def _parquet_files(directory: str) -> list[str]:
    import pyarrow.fs as pafs

    fs, path = filesystem(directory)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    prefix = directory[: len(directory) - len(path)] if "://" in directory else ""
    return sorted(prefix + i.path for i in infos if i.is_file and i.path.endswith(".parquet"))


def _rows(paths: list[str]) -> int:
    import pyarrow.parquet as pq

    total = 0
    for p in paths:
        fs, path = filesystem(p)
        with fs.open_input_file(path) as f:
            total += pq.ParquetFile(f).metadata.num_rows
    return total


def _reader(spark: Any, uri: str, table: str, token: str | None, **options: str) -> Any:
    r = spark.read.format("harness-flight").option("uri", uri).option("table", table)
    if token:
        r = r.option("token", token)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _write_parquet(df: Any, directory: str, files: int | None = None) -> list[str]:
    spark = df.sparkSession
    # Iceberg and most readers want microsecond timestamps, not Spark's INT96 default.
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    (df.coalesce(files) if files else df).write.mode("errorifexists").parquet(directory)
    return _parquet_files(directory)


def move(
    spark: Any,
    uri: str,
    client: HarnessClient,
    table: str,
    hot: str,
    cold: str,
    *,
    where: str | None = None,
    token: str | None = None,
) -> MoveResult:
    """Move ``hot``'s rows (those matching ``where``) into ``cold`` with Spark executors
    reading and writing them; the gateway adopts the files and commits (``harness.move``)."""
    desc = client.describe(table)
    columns = [f.name for f in desc.schema if f.name not in ops.READ_TIME_COLUMNS]
    begun = client.begin_write(table, cold)
    if begun["mode"] != "stage":
        raise ValueError(f"source {cold!r} cannot take staged files: its kind adopts none")
    options = {"version": str(desc.version), "sources": hot, "columns": ",".join(columns)}
    if where:
        options["filter"] = where
    try:
        df = _reader(spark, uri, table, token, **options)
        files = _write_parquet(df, f"{begun['location'].rstrip('/')}/moved")
        mover = Mover(client, table, hot, cold, where=where)
        return mover.run_once(
            write_id=begun["write_id"], paths=files, version=desc.version, rows=_rows(files)
        )
    except BaseException:
        client.abort_write(table, begun["write_id"], cold)
        raise


def compact(
    spark: Any,
    uri: str,
    client: HarnessClient,
    table: str,
    source: str,
    *,
    files: int = 1,
    token: str | None = None,
) -> MoveResult:
    """Rewrite ``source`` as ``files`` Parquet files in one harness commit, through the
    gateway's engine-write actions (any kind that adopts files). The commit is a relocation:
    streaming readers do not see the rewritten rows again. Readers pinned to older versions keep
    reading the old files."""

    def write(pinned: int, location: str) -> tuple[list[str], int]:
        df = _reader(spark, uri, table, token, version=str(pinned), sources=source)
        written = _write_parquet(df, f"{location}/compacted", files)
        return written, _rows(written)

    return rewrite_source(client, table, source, write)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipelines.spark_jobs")
    parser.add_argument("job", choices=["flush", "cold-move", "compact"])
    parser.add_argument("--uri", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--token")
    parser.add_argument("--hot", help="flush: the Kafka source; cold-move: the Postgres source")
    parser.add_argument("--cold", help="flush, cold-move: the Iceberg source")
    parser.add_argument("--where", help="cold-move: only rows matching this harness filter")
    parser.add_argument("--source", help="compact: the source to rewrite")
    parser.add_argument("--files", type=int, default=1)
    return parser


def run_job(spark: Any, client: HarnessClient, args: argparse.Namespace) -> MoveResult:
    """Run the job the command line names."""
    common = {"token": args.token}
    if args.job in ("flush", "cold-move") and not (args.hot and args.cold):
        raise SystemExit(f"{args.job} needs --hot and --cold")
    if args.job in ("flush", "cold-move"):
        where = args.where if args.job == "cold-move" else None
        return move(spark, args.uri, client, args.table, args.hot, args.cold, where=where,
                    **common)  # fmt: skip
    if not args.source:
        raise SystemExit("compact needs --source")
    return compact(spark, args.uri, client, args.table, args.source, files=args.files, **common)


def main(argv: list[str] | None = None) -> int:
    from pyspark.sql import SparkSession

    from spark_datasource import register

    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    spark = SparkSession.builder.appName(f"harness-{args.job}").getOrCreate()
    register(spark)
    client = HarnessClient(args.uri, token=args.token)
    try:
        result = run_job(spark, client, args)
        log.info("%s: version %s, %d rows", args.job, result.version, result.rows)
    finally:
        client.close()
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
