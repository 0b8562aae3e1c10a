"""``df.write.format("harness-flight")``: executors write, the driver commits once.

The gateway decides how (``harness.begin_write``), by the target source's kind:

- ``stage`` mode (kinds that adopt files, e.g. ``files`` and ``iceberg``): executors write one
  Parquet file per task into the write's staging directory, created by the gateway; the driver
  publishes exactly those files with ``harness.commit_write`` (``mode("overwrite")`` replaces the
  source's files). A failed task removes its own file, and ``abort`` removes the whole directory,
  so a failed write leaves no commit and no orphan files.
- ``upload`` mode (kinds that only append, e.g. ``kafka``, ``postgres``): executors hand their
  rows to the driver as Arrow IPC, and the driver uploads them with one DoPut (idempotent by the
  write's commit id). The whole write passes through the driver: keep such writes moderate
  (option ``max_upload_bytes``, default 1 GiB) or write to a files-adopting source.

Option ``source`` names the target; without it the table must have exactly one writable source.
Source configs stay in the gateway: no credentials are needed on the driver or executors
beyond access to the staging location in ``stage`` mode.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from spark_datasource.common import client

log = logging.getLogger(__name__)
DEFAULT_MAX_UPLOAD_BYTES = 1 << 30


@dataclass
class Written(WriterCommitMessage):
    paths: list[str] = field(default_factory=list)  # stage mode: full paths or URIs
    ipc: bytes = b""  # upload mode: the task's rows as an Arrow IPC stream
    rows: int = 0


def _filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    if "://" in location:
        fs, path = pafs.FileSystem.from_uri(location)
        return fs, path
    return pafs.LocalFileSystem(), location


class HarnessFlightWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.options, self.overwrite = options, overwrite
        self.table = options.get("table") or ""
        if not self.table:
            raise ValueError("harness-flight needs option 'table'")
        self.max_upload = int(options.get("max_upload_bytes", DEFAULT_MAX_UPLOAD_BYTES))
        with client(options) as c:
            begun = c.begin_write(self.table, options.get("source") or None)
        self.write_id, self.source, self.mode = begun["write_id"], begun["source"], begun["mode"]
        self.location = begun.get("location", "")
        if self.mode == "upload" and overwrite:
            raise ValueError(
                f"harness-flight: source {self.source!r} only appends; overwrite needs a source "
                "that adopts files (files, iceberg)"
            )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        if self.mode == "upload":
            return self._buffer(iterator)
        return self._write_file(iterator)

    def _buffer(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        sink = pa.BufferOutputStream()
        writer, rows = None, 0
        for batch in iterator:
            if writer is None:
                writer = pa.ipc.new_stream(sink, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
            if sink.tell() > self.max_upload:
                raise ValueError(
                    f"harness-flight: more than max_upload_bytes={self.max_upload} to upload to "
                    f"{self.source!r}; write to a source that adopts files instead"
                )
        if writer is None:
            return Written()
        writer.close()
        return Written(ipc=sink.getvalue().to_pybytes(), rows=rows)

    def _write_file(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx else 0
        location = f"{self.location}/part-{part:05d}-{uuid.uuid4().hex[:8]}.parquet"
        fs, path = _filesystem(location)
        rows = 0
        try:
            writer = None
            with fs.open_output_stream(path) as out:
                for batch in iterator:
                    if writer is None:
                        writer = pq.ParquetWriter(out, batch.schema)
                    writer.write_batch(batch)
                    rows += batch.num_rows
                if writer is not None:
                    writer.close()
            if writer is None:  # an empty partition writes nothing
                fs.delete_file(path)
                return Written()
        except BaseException:
            try:
                fs.delete_file(path)  # a failed task leaves no partial file behind
            finally:
                raise
        return Written(paths=[location], rows=rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, Written)]
        rows = sum(m.rows for m in done)
        with client(self.options) as c:
            if self.mode == "stage":
                files = [p for m in done for p in m.paths]
                c.commit_write(
                    self.table,
                    self.write_id,
                    files,
                    source=self.source,
                    overwrite=self.overwrite,
                    rows=rows,
                )
            elif rows:
                tables = [pa.ipc.open_stream(m.ipc).read_all() for m in done if m.ipc]
                data = pa.concat_tables(tables, promote_options="default")
                c.put(
                    self.table, data, commit_id=f"spark-write:{self.write_id}", source=self.source
                )
        log.info("harness-flight write %s: %d rows -> %s", self.write_id, rows, self.source)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.mode == "stage":
            with client(self.options) as c:
                c.abort_write(self.table, self.write_id, self.source)
        log.warning("harness-flight write %s aborted", self.write_id)
