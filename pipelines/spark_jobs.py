"""Data pipelines on Spark: executors move the data, the driver commits once.

- ``SparkKafkaToIcebergFlush``: lock a Kafka partition and the Iceberg source, read the
  partition's ``[low, high)`` through ``harness-flight`` at the pinned version, write Parquet
  with Spark, register the files with one pyiceberg ``add_files`` and commit
  ``{snapshot, low = high}`` in one harness commit. Locking, idempotency and the adoption of
  orphaned appends are the library mover's (``pipelines.movers``).
- ``compact``: rewrite a files or Iceberg source as fewer, larger files in one commit; readers
  pinned to older versions keep reading the old files.

- ``SparkPostgresToIcebergMove``: the cold move of a versioned Postgres table to Iceberg, with
  the data read and written by Spark executors.

Run as ``python -m pipelines.spark_jobs flush|cold-move|compact --uri ... --table ...`` or with
``spark-submit``.
"""

from __future__ import annotations

import argparse
import logging
import uuid
from typing import Any

from clients import HarnessClient
from flight_gateway.protocol import TableInfo
from flight_gateway.protocol import operations as ops
from pipelines.compaction import rewrite_source
from pipelines.movers import KafkaToIcebergMover, MoveResult, PostgresToIcebergMover, checkpoint
from planners.common import filesystem

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


class _OnSpark:
    """What a mover needs to move its data with Spark instead of in the driver."""

    def __init__(
        self,
        spark: Any,
        uri: str,
        client: HarnessClient,
        table: str,
        hot: str,
        cold: str,
        *,
        token: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(client, table, hot, cold, **kw)  # type: ignore[call-arg]
        self.spark, self.uri, self.token = spark, uri, token


class SparkKafkaToIcebergFlush(_OnSpark, KafkaToIcebergMover):
    def _append(
        self, itable: Any, desc: TableInfo, low: int, high: int, props: dict[str, str]
    ) -> int:
        if low != int(desc.source(self.hot).state.get("low", 0)):
            # An adopted orphan moved low past the pinned state: read the rest directly.
            return super()._append(itable, desc, low, high, props)
        schema = itable.schema().as_arrow()
        df = _reader(
            self.spark,
            self.uri,
            self.table,
            self.token,
            version=str(desc.version),
            sources=self.hot,
            columns=",".join(schema.names),
        )
        staging = f"{itable.location().rstrip('/')}/data/harness-spark-{uuid.uuid4().hex}"
        files = _write_parquet(df, staging)
        checkpoint("kafka_iceberg.before_append")
        if files:
            itable.add_files(files, snapshot_properties=props)
        else:  # nothing to register, but the snapshot marks the move for adoption
            import pyarrow as pa

            itable.append(pa.Table.from_pylist([], schema=schema), snapshot_properties=props)
        return _rows(files)


class SparkPostgresToIcebergMove(_OnSpark, PostgresToIcebergMover):
    """The cold move on Spark: executors read the Postgres source through harness-flight at the
    pinned version and write Parquet; the driver registers the files (one ``add_files``),
    deletes the moved keys from Postgres and commits snapshot and ``as_of`` together. Locking,
    adoption of orphaned appends and the commit are the library mover's."""

    def _move_rows(
        self,
        conn: Any,
        sql: str,
        params: list[Any],
        itable: Any,
        keys: list[str],
        props: dict[str, str],
        version: int,
    ) -> Any:
        import pyarrow as pa
        import pyarrow.dataset as ds

        schema = itable.schema().as_arrow()
        options = {"version": str(version), "sources": self.hot, "columns": ",".join(schema.names)}
        if self.where:
            options["filter"] = self.where
        df = _reader(self.spark, self.uri, self.table, self.token, **options)
        files = _write_parquet(
            df, f"{itable.location().rstrip('/')}/data/harness-spark-{uuid.uuid4().hex}"
        )
        if not files:
            return pa.table({k: pa.array([], schema.field(k).type) for k in keys})
        n = _rows(files)
        checkpoint("postgres_iceberg.before_append")
        itable.add_files(files, snapshot_properties={**props, ops.SNAP_ROWS: str(n)})
        checkpoint("postgres_iceberg.after_append")
        fs, _ = filesystem(files[0])
        return ds.dataset(
            [filesystem(f)[1] for f in files], format="parquet", filesystem=fs
        ).to_table(columns=keys)


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

    return rewrite_source(client, table, source, write, owner="spark-compaction", ttl_s=600)


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
    if args.job == "flush":
        flush = SparkKafkaToIcebergFlush(
            spark, args.uri, client, args.table, args.hot, args.cold, owner="spark-flush", **common
        )
        return flush.run_once()
    if args.job == "cold-move":
        move = SparkPostgresToIcebergMove(
            spark,
            args.uri,
            client,
            args.table,
            args.hot,
            args.cold,
            where=args.where,
            owner="spark-cold-move",
            **common,
        )
        return move.run_once()
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
