"""``df.write.format("harness-flight")``: executors write Parquet, the driver commits once.

Targets: a ``files`` source (new files join its list) or an ``iceberg`` source (the driver
registers the files with one pyiceberg ``add_files``, then makes the harness commit). Option
``source`` names the target; without it the table must have exactly one such source.
``mode("overwrite")`` replaces the source's contents in the new version; older versions keep
their files. A failed task removes its own file and ``abort`` removes every file the write
made (its whole directory), so a failed write leaves no commit and no orphan files.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from planners.files import filesystem
from spark_datasource.source import _client

log = logging.getLogger(__name__)
WRITABLE = ("files", "iceberg")


@dataclass
class FilesWritten(WriterCommitMessage):
    paths: list[str] = field(default_factory=list)  # full paths (URIs for Iceberg)
    names: list[str] = field(default_factory=list)  # names relative to a files source root
    rows: int = 0


class HarnessFlightWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        from flight_gateway.catalog.config import resolve_config

        self.options, self.overwrite = options, overwrite
        self.table = options.get("table") or ""
        self.write_id = uuid.uuid4().hex
        with _client(options) as c:
            desc = c.describe(self.table)
        candidates = [s for s in desc["sources"] if s["kind"] in WRITABLE]
        if options.get("source"):
            candidates = [s for s in candidates if s["name"] == options["source"]]
        if len(candidates) != 1:
            raise ValueError(
                f"harness-flight write: name a files or iceberg 'source' of table {self.table!r} (candidates: {[s['name'] for s in candidates]})"
            )
        target = candidates[0]
        self.source, self.kind = target["name"], target["kind"]
        self.config = resolve_config(target["config"])
        if self.kind == "files":
            base = str(self.config.get("root", "")).rstrip("/")
        else:
            from planners.iceberg import load_table

            base = load_table(self.config).location().rstrip("/") + "/data"
        # One directory per write, created here on the driver. Executors only write into it
        # and never create it, so abort() can remove everything the write made at once, even
        # files of tasks Spark did not report and of stragglers still running after the abort.
        self.subdir = f"spark-{self.write_id}"
        self.directory = f"{base}/{self.subdir}"
        fs, path = filesystem(self.directory)
        fs.create_dir(path, recursive=True)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx else 0
        name = f"part-{part:05d}-{uuid.uuid4().hex[:8]}.parquet"
        location = f"{self.directory}/{name}"
        fs, path = filesystem(location)
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
                return FilesWritten()
        except BaseException:
            try:
                fs.delete_file(path)  # a failed task leaves no partial file behind
            finally:
                raise
        return FilesWritten([location], [f"{self.subdir}/{name}"], rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, FilesWritten)]
        paths = [p for m in done for p in m.paths]
        names = [n for m in done for n in m.names]
        rows = sum(m.rows for m in done)
        with (
            _client(self.options) as c,
            c.lock(
                self.table,
                [self.source],
                owner=f"spark-write-{self.write_id}",
                ttl_s=300,
                wait_s=120,
            ) as lock,
        ):
            state = next(s for s in c.describe(self.table)["sources"] if s["name"] == self.source)[
                "state"
            ]
            if self.kind == "files":
                files = ([] if self.overwrite else list(state.get("files", []))) + names
                new_state = {**state, "files": files}
            else:
                new_state = {**state, "snapshot_id": self._iceberg_commit(paths)}
            c.commit(
                self.table,
                commit_id=f"spark-write:{self.write_id}",
                lock=lock,
                updates=[{"source": self.source, "state": new_state}],
                summary={
                    "operation": "spark-overwrite" if self.overwrite else "spark-append",
                    "rows": rows,
                    "files": len(paths),
                },
            )
        log.info(
            "harness-flight write %s: %d rows in %d files -> %s",
            self.write_id,
            rows,
            len(paths),
            self.source,
        )

    def _iceberg_commit(self, paths: list[str]) -> Any:
        from pyiceberg.expressions import AlwaysTrue

        from planners.iceberg import load_table

        table = load_table(self.config)
        props = {"harness.commit-id": f"spark-write:{self.write_id}"}
        with table.transaction() as tx:
            if self.overwrite:
                tx.delete(AlwaysTrue(), snapshot_properties=props)
            if paths:
                tx.add_files(paths, snapshot_properties=props)
        table.refresh()
        snap = table.current_snapshot()
        return snap.snapshot_id if snap else None

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        fs, path = filesystem(self.directory)
        with contextlib.suppress(FileNotFoundError):
            fs.delete_dir(path)
        log.warning(
            "harness-flight write %s aborted; %s was removed", self.write_id, self.directory
        )
