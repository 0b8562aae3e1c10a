"""Compaction without Spark: rewrite one source's rows as a few Parquet files in one harness
commit, through the gateway's engine-write actions (any kind that adopts files; the Spark
job is ``pipelines.spark_jobs.compact``).

The rows are read through the gateway at one pinned version, so row-level deletes (Iceberg
position and equality deletes) are applied: the rewritten files hold no deleted row, and the
delete files no longer apply to anything (Iceberg applies an equality delete to data of a
lower sequence number only). The commit is a relocation, so streaming readers do not see the
rows again; readers pinned to older versions keep reading the old files. It is optimistic
(DESIGN §18): writers to the source go on meanwhile and their rows stay.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from clients import HarnessClient
from flight_gateway.protocol.errors import Conflict
from pipelines.mover import MoveResult

log = logging.getLogger(__name__)


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a staging location (a local path or a URI)."""
    if "://" in location:
        fs, path = pafs.FileSystem.from_uri(location)
        return fs, path
    return pafs.LocalFileSystem(), location


def _strict(data: pa.Table) -> pa.Table:
    """Columns without nulls as required fields: a source may declare them required (an
    Iceberg key column) while the harness column is nullable; required data fits both."""
    fields = [
        f.with_nullable(f.nullable and data.column(f.name).null_count > 0) for f in data.schema
    ]
    return data.cast(pa.schema(fields))


def rewrite_source(
    client: HarnessClient,
    table: str,
    source: str,
    write: Callable[[int, str], tuple[list[str], int]],
    *,
    attempts: int = 5,
) -> MoveResult:
    """Optimistic (DESIGN §18): ``write(pinned version, staging location)`` writes the
    source's rows at that version as files there and returns (their paths, row count); they
    replace what the source held at that version in one relocation commit, and rows written
    since stay. No lock is held while the rows are read and written, so writers never wait for
    it; when the source was rewritten or deleted from meanwhile (a CONFLICT) it reads again,
    up to ``attempts`` times. The staged files are removed if anything fails."""
    for attempt in range(1, attempts + 1):
        pinned = client.describe(table).version
        begun = client.begin_write(table, source)
        if begun["mode"] != "stage":
            raise ValueError(f"source {source!r} cannot be compacted: its kind adopts no files")
        try:
            written, rows = write(pinned, begun["location"])
            version = client.commit_write(
                table,
                begun["write_id"],
                written,
                source=source,
                overwrite=True,
                relocation=True,
                rows=rows,
                read_version=pinned,
            )
        except Conflict as e:
            client.abort_write(table, begun["write_id"], source)
            if attempt == attempts:
                raise
            log.info("rewrite of %s/%s read version %d: %s; again", table, source, pinned, e)
            continue
        except BaseException:
            client.abort_write(table, begun["write_id"], source)
            raise
        log.info("compacted %s/%s into %d files as version %d", table, source, len(written),
                 version)  # fmt: skip
        return MoveResult(version, rows)
    raise AssertionError("unreachable")


def compact(
    client: HarnessClient, table: str, source: str, *, rows_per_file: int = 4_000_000
) -> MoveResult:
    def write(pinned: int, location: str) -> tuple[list[str], int]:
        data = _strict(client.read(table, version=pinned, sources=[source]))
        fs, root = filesystem(location)
        written = []
        for start in range(0, max(data.num_rows, 1), rows_per_file):
            name = f"compacted-{uuid.uuid4().hex}.parquet"
            with fs.open_output_stream(f"{root}/{name}") as out:
                pq.write_table(
                    data.slice(start, rows_per_file), out, store_decimal_as_integer=True
                )  # decimals as Spark, DuckDB and the files kind write them (planners.files)
            written.append(f"{location.rstrip('/')}/{name}")
        return written, data.num_rows

    return rewrite_source(client, table, source, write)
