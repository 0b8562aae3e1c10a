"""The ``harness-flight`` PySpark DataSource: read (with filter pushdown), write, stream.

Options (the same names as the Python client and the wire): ``uri``, ``table``, ``token``,
``version``, ``as_of``, ``columns`` (comma-separated: no column pruning reaches a Python data
source), ``filter``, ``dedupe``, and ``sources`` (comma-separated source names: read only
those, an extension used by pipelines); ``pushdown`` (see ``spark_datasource.reader``),
``starting_version`` (streaming), ``source`` and ``max_upload_bytes`` (writes); ``endpoints``
(JSON list of endpoints planned elsewhere, pinned by ``version``: the Flight half of
``spark_datasource.native.read_native``).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from spark_datasource.common import client, read_args
from spark_datasource.reader import HarnessFlightReader, PushdownReader
from spark_datasource.stream import HarnessFlightStreamReader
from spark_datasource.writer import HarnessFlightWriter


class HarnessFlightDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "harness-flight"

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        args = read_args(dict(self.options))
        with client(dict(self.options)) as c:
            arrow = c.schema(
                self.options["table"], columns=args["columns"], version=args.get("version")
            )
        return from_arrow_schema(arrow)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = dict(self.options)
        if str(options.get("pushdown", "false")).lower() == "true":
            return PushdownReader(options, schema)
        # No pushFilters at all: Spark filters exactly, and no session setting is required.
        return HarnessFlightReader(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> HarnessFlightWriter:
        return HarnessFlightWriter(dict(self.options), schema, overwrite)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return HarnessFlightStreamReader(dict(self.options), schema)


def register(spark: Any) -> None:
    """Make ``format("harness-flight")`` available in this Spark session."""
    spark.dataSource.register(HarnessFlightDataSource)
