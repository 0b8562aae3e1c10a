"""PySpark DataSource ``harness-flight`` (read, write, streaming). Knows the client only."""

from spark_datasource.source import HarnessFlightDataSource, register

__all__ = ["HarnessFlightDataSource", "register"]
