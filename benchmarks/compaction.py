"""Compaction as an operator runs it between writers: one source rewritten as one Parquet file
in one harness commit (``overwrite`` and ``relocation``: what ``pipelines.spark_jobs.compact``
does, with pyarrow). Writers to that source wait for its lock meanwhile."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from clients import HarnessClient


def compact(client: HarnessClient, table: str, source: str, schema: pa.Schema) -> int:
    """Rewrite ``source`` of ``table`` as one file; the rows it holds."""
    from planners.common import filesystem

    owner = f"bench-compaction-{source}"
    with client.lock(table, [source], owner=owner, ttl_s=120, wait_s=120) as lock:
        pinned = client.describe(table).version
        data = client.read(table, version=pinned, sources=[source], columns=schema.names)
        begun = client.begin_write(table, source)
        path = f"{begun['location']}/compacted/{uuid.uuid4().hex}.parquet"
        fs, local = filesystem(path)
        fs.create_dir(local.rpartition("/")[0], recursive=True)
        try:
            with fs.open_output_stream(local) as out:
                pq.write_table(data.cast(schema), out)
            client.commit_write(
                table,
                begun["write_id"],
                [path],
                source=source,
                overwrite=True,
                relocation=True,
                rows=data.num_rows,
                lock=lock,
            )
        except BaseException:
            client.abort_write(table, begun["write_id"], source)
            raise
    return data.num_rows
