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
from flight_gateway.catalog.config import resolve_config
from pipelines.movers import KafkaToIcebergMover, MoveResult, PostgresToIcebergMover, checkpoint
from planners.files import filesystem

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
        self,
        itable: Any,
        srcs: dict[str, dict[str, Any]],
        low: int,
        high: int,
        props: dict[str, str],
    ) -> int:
        if low != int(srcs[self.hot]["state"].get("low", 0)):
            # An adopted orphan moved low past the pinned state: read the rest directly.
            return super()._append(itable, srcs, low, high, props)
        schema = itable.schema().as_arrow()
        df = _reader(
            self.spark,
            self.uri,
            self.table,
            self.token,
            version=str(self.pinned_version),
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
        itable.add_files(files, snapshot_properties={**props, "harness.rows": str(n)})
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
    """Rewrite ``source`` (files or Iceberg) as ``files`` Parquet files in one harness commit."""
    from pyiceberg.expressions import AlwaysTrue

    from planners.iceberg import load_table

    with client.lock(table, [source], owner="spark-compaction", ttl_s=600, wait_s=120) as lock:
        desc = client.describe(table)
        src = next(s for s in desc["sources"] if s["name"] == source)
        config = resolve_config(src["config"])
        job = uuid.uuid4().hex
        df = _reader(spark, uri, table, token, version=str(desc["version"]), sources=source)
        if src["kind"] == "files":
            root = str(config.get("root", "")).rstrip("/")
            written = _write_parquet(df, f"{root}/compacted-{job}", files)
            names = [p[len(root) + 1 :] if p.startswith(root + "/") else p for p in written]
            state = {**src["state"], "files": names}
        elif src["kind"] == "iceberg":
            itable = load_table(config)
            schema = itable.schema().as_arrow()
            written = _write_parquet(
                df.select(*schema.names),
                f"{itable.location().rstrip('/')}/data/compacted-{job}",
                files,
            )
            with itable.transaction() as tx:
                tx.delete(AlwaysTrue(), snapshot_properties={"harness.compaction": job})
                if written:
                    tx.add_files(written, snapshot_properties={"harness.compaction": job})
            itable.refresh()
            state = {**src["state"], "snapshot_id": itable.current_snapshot().snapshot_id}
        else:
            raise ValueError(f"compaction supports files and iceberg sources, not {src['kind']}")
        version = client.commit(
            table,
            commit_id=f"compact:{table}:{source}:{job}",
            lock=lock,
            updates=[
                {"source": source, "state": state, "expect_state_version": src["state_version"]}
            ],
            summary={"operation": "compaction", "files": len(written), "rows": _rows(written)},
        )
    log.info("compacted %s/%s into %d files as version %d", table, source, len(written), version)
    return MoveResult(version, _rows(written))


def main(argv: list[str] | None = None) -> int:
    from pyspark.sql import SparkSession

    from spark_datasource import register

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
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    spark = SparkSession.builder.appName(f"harness-{args.job}").getOrCreate()
    register(spark)
    client = HarnessClient(args.uri, token=args.token)
    try:
        if args.job == "flush":
            result = SparkKafkaToIcebergFlush(
                spark,
                args.uri,
                client,
                args.table,
                args.hot,
                args.cold,
                token=args.token,
                owner="spark-flush",
            ).run_once()
        else:
            result = compact(
                spark, args.uri, client, args.table, args.source, files=args.files, token=args.token
            )
        log.info("%s: version %s, %d rows", args.job, result.version, result.rows)
    finally:
        client.close()
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
