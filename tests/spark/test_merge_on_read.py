"""Spark reads an Iceberg table with equality and position deletes like DuckDB's iceberg
extension does: through ``harness-flight`` and through the native path (whose tasks with
deletes come from the gateway)."""

from __future__ import annotations

from typing import Any

import pytest

from clients import HarnessClient
from tests.gateway.test_merge_on_read import duck, duck_read, mor  # noqa: F401 - fixtures

pytestmark = pytest.mark.integration


def _rows(df: Any) -> list[dict[str, Any]]:
    return sorted(
        (r.asDict() for r in df.select("id", "name", "qty").collect()), key=lambda r: r["id"]
    )


def test_both_spark_paths_apply_deletes(
    spark: Any,
    client: HarnessClient,
    mor: dict[str, Any],  # noqa: F811
    duck: Any,  # noqa: F811
) -> None:
    from spark_datasource.native import read_native

    want = duck_read(duck, mor["table"], mor["latest"])
    flight = spark.read.format("harness-flight").option("uri", client.uri).option("table", "t")
    assert _rows(flight.load()) == want
    assert _rows(read_native(spark, client.uri, "t")) == want
    assert _rows(read_native(spark, client.uri, "t", version=mor["v3"])) == duck_read(
        duck, mor["table"], mor["s3"]
    )
