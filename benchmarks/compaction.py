"""Compaction as an operator runs it between writers: one source rewritten as one Parquet file
in one harness commit (``overwrite`` and ``relocation``: what ``pipelines.spark_jobs.compact``
does, with pyarrow). Optimistic (DESIGN §18): writers to that source go on meanwhile."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from clients import HarnessClient
from pipelines.compaction import filesystem, rewrite_source


def compact(
    client: HarnessClient, table: str, source: str, schema: pa.Schema, direct: bool = False
) -> int:
    """Rewrite ``source`` of ``table`` as one file; the rows it held at the version read
    (``direct``: the files of a source that allows it are read here, not through the gateway)."""

    def write(pinned: int, location: str) -> tuple[list[str], int]:
        data = client.read(
            table, version=pinned, sources=[source], columns=schema.names, direct=direct
        )
        path = f"{location}/compacted/{uuid.uuid4().hex}.parquet"
        fs, local = filesystem(path)
        fs.create_dir(local.rpartition("/")[0], recursive=True)
        with fs.open_output_stream(local) as out:
            pq.write_table(data.cast(schema), out)
        return [path], data.num_rows

    return rewrite_source(client, table, source, write).rows
