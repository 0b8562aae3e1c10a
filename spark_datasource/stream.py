"""``spark.readStream.format("harness-flight")``: offsets are harness table versions.

Each micro-batch reads what the versions between its start and end offsets added (new Kafka
offset ranges, new files, appended snapshots, new Postgres row versions), planned by the
gateway with the read descriptor's ``since`` extension. Moves and compaction add no rows, so
they are never delivered twice; with a checkpointed query every row arrives exactly once across
restarts. Option ``starting_version`` (default -1: the whole table at the first batch's version).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from spark_datasource.common import client, partitions_of, read_args
from spark_datasource.reader import read_partition


class HarnessFlightStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def initialOffset(self) -> dict:
        return {"version": int(self.options.get("starting_version", -1))}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        with client(self.options) as c:
            return {"version": c.describe(self.options["table"]).version}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        args = read_args(self.options)
        args.pop("version", None)
        args.pop("as_of", None)
        since = int(start["version"])
        with client(self.options) as c:
            info = c.flight_info(
                self.options["table"],
                version=int(end["version"]),
                since=since if since >= 0 else None,
                **args,
            )
        return partitions_of(info, int(json.loads(info.app_metadata)["version"]))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, self.schema, partition)

    def commit(self, end: dict) -> None:
        pass  # nothing to release: versions stay readable within the catalog's retention
