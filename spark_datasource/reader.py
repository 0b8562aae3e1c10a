"""Batch reads: one Spark partition per Flight endpoint, all pinned to the driver's version.

Filter pushdown: the ``filter`` option is always pushed to the gateway and is always correct.
Spark's own filters (``df.filter``, SQL ``WHERE``) are pushed only with ``pushdown=true``:
pyspark 4.3.0 caches the planned read (partitions and read function) on the relation, so after
a filtered query a later query on the same DataFrame or view reuses the filtered plan and
returns too few rows (reproduced in tests/spark; fixed upstream by scoping the read info to the
scan). By default every Spark filter is handed back to Spark, which then filters exactly.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition
from pyspark.sql.types import StructType

from spark_datasource.common import (
    EndpointPartition,
    client,
    given_partitions,
    partitions_of,
    read_args,
)
from spark_datasource.filters import Unsupported, to_filter_sql

log = logging.getLogger(__name__)


def read_partition(
    options: dict[str, str], schema: StructType, partition: InputPartition
) -> Iterator[pa.RecordBatch]:
    import pyarrow.flight as fl
    from pyspark.sql.pandas.types import to_arrow_schema

    if not isinstance(partition, EndpointPartition):
        return  # no endpoints: Spark still runs one task with a placeholder partition
    target = to_arrow_schema(schema, timezone="UTC")
    with client(options) as c:
        ep = fl.FlightEndpoint(partition.ticket, partition.locations)
        # With replicas a cut stream is fetched again whole (no row twice); else streamed.
        batches = c.fetch_endpoint(ep).to_batches() if c.has_replicas else c.read_endpoint(ep)
        for batch in batches:
            # Spark wants its exact Arrow schema: string (not large), us UTC timestamps.
            yield batch.select(target.names).cast(target) if batch.schema != target else batch


class HarnessFlightReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.pushed: list[str] = []

    def partitions(self) -> list[InputPartition]:
        if "endpoints" in self.options:  # planned already (the native path's Flight half)
            return given_partitions(self.options)
        args = read_args(self.options, self.pushed)
        with client(self.options) as c:
            info = c.flight_info(self.options["table"], **args)
        version = int(json.loads(info.app_metadata)["version"])
        log.info(
            "harness-flight %s@%d: %d endpoints, pushed %s",
            self.options["table"],
            version,
            len(info.endpoints),
            self.pushed,
        )
        return partitions_of(info, version)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, self.schema, partition)


class PushdownReader(HarnessFlightReader):
    """``pushdown=true``: Spark filters the harness grammar can express are pushed to the
    gateway. Needs ``spark.sql.python.filterPushdown.enabled=true``; unsafe on pyspark 4.3.0
    when a DataFrame or view is queried again with other filters (module docstring)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.pushed = []  # this call describes the current query only
        for f in filters:
            try:
                self.pushed.append(to_filter_sql(f))
            except Unsupported:
                yield f
