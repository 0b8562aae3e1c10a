"""Spark at native speed: the gateway plans, Spark's own readers read the cold files.

``read_native(spark, uri, table, ...)`` asks the gateway for one pinned read with direct tasks
(DESIGN.md §10). Tasks the gateway hands out as direct (files, Iceberg data files without delete
files, Delta and Paimon files) are read by Spark's native, vectorised Parquet/ORC readers on
exactly those files, conformed in Spark to the harness columns of the pinned version: each
column found by Parquet field id, else by its current or former names (renames), missing
columns as typed nulls, every column cast to its harness type (widening), the residual filter
applied as Spark SQL, ``_source`` as a literal. Every other task (hot sources: Kafka, Postgres,
...; Iceberg files with deletes) is read through ``harness-flight`` restricted to exactly those
endpoints of the same plan, so both halves read the same pinned version; the result is their
``unionByName``.

Planning is one gateway call: the files of all direct tasks with the same shape and physical
layout are one native read, given its read schema (from the files' footers the driver reads
anyway), so Spark neither infers a schema nor lists anything before the scan.

``register_native_view(spark, name, ...)`` registers the result as a temporary view for Spark
SQL. The view is pinned: it reads the version planned when it was registered.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)
_FIELD_ID = b"PARQUET:field_id"


Layout = tuple[tuple[str | None, ...], tuple[tuple[str, str], ...]]


def _layout(path: str, columns: Sequence[Any]) -> Layout:
    """The file's column for each harness column (by field id, else by any of its names), and
    the read schema: those physical columns with the file's types (so Spark infers nothing)."""
    import pyarrow.parquet as pq

    from clients.direct import _filesystem

    fs, p = _filesystem(path)
    schema = pq.read_schema(p, filesystem=fs)
    by_id = {
        int(f.metadata[_FIELD_ID]): f.name for f in schema if f.metadata and _FIELD_ID in f.metadata
    }
    names = set(schema.names)
    out = []
    for c in columns:
        if c.field_id is not None and c.field_id in by_id:
            out.append(by_id[c.field_id])
        else:
            out.append(next((n for n in c.names if n in names), None))
    read = tuple((n, str(schema.field(n).type)) for n in dict.fromkeys(o for o in out if o))
    return tuple(out), read


def _read_schema(read: tuple[tuple[str, str], ...]) -> Any:
    """A Spark schema for the physical columns, or None when a type has no Spark twin (Spark
    then infers it from the files)."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    from flight_gateway.protocol.arrow_types import parse_type

    try:
        return StructType([StructField(n, from_arrow_type(parse_type(t))) for n, t in read])
    except Exception:  # e.g. unsigned integers: let Spark read the footer
        return None


def _spark_filter(text: str | None) -> str | None:
    """The harness filter (SQL) in Spark's dialect."""
    if not text:
        return None
    import sqlglot

    return str(sqlglot.transpile(text, write="spark")[0])


def _conformed(spark: Any, task: Any, files: list[str], layout: Layout) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    from flight_gateway.protocol.arrow_types import parse_type

    physical, read = layout
    reader = spark.read.format(task.format)
    schema = _read_schema(read) if read and task.format == "parquet" else None
    if schema is not None:  # no schema inference: Spark would read a footer in a job first
        reader = reader.schema(schema)
    df = reader.load(files)
    cols = []
    for c, phys in zip(task.columns, physical, strict=True):
        spark_type = from_arrow_type(parse_type(c.type))
        source = F.col(f"`{phys}`") if phys is not None else F.lit(None)
        cols.append(source.cast(spark_type).alias(c.name))
    df = df.select(*cols)
    flt = _spark_filter(task.filter)
    if flt:
        df = df.filter(flt)
    for name, value in task.constants.items():
        df = df.withColumn(name, F.lit(value))
    return df.select(*[f"`{n}`" for n in task.output])


def _direct_frames(spark: Any, tasks: list[Any]) -> list[Any]:
    """One native read per group of files that share a task shape and a physical layout."""
    groups: dict[tuple[str, Layout], tuple[Any, list[str]]] = {}
    for task in tasks:
        shape = json.dumps(  # what the conforming depends on (not the files, nor the expiry)
            {k: v for k, v in task.to_json().items() if k not in ("files", "exp")},
            sort_keys=True,
            default=str,
        )
        for f in task.files:
            layout: Layout = (
                _layout(f, task.columns)
                if task.format == "parquet"
                else (tuple(c.name for c in task.columns), ())
            )
            groups.setdefault((shape, layout), (task, []))[1].append(f)
    return [_conformed(spark, task, files, layout) for (_, layout), (task, files) in groups.items()]


def _flight_frame(spark: Any, uri: str, table: str, token: str | None, endpoints: list[Any]) -> Any:
    from spark_datasource import register

    register(spark)
    listed = [
        {
            "ticket": base64.b64encode(ep.ticket.ticket).decode(),
            "locations": [
                loc.uri.decode() if isinstance(loc.uri, bytes) else str(loc.uri)
                for loc in ep.locations
            ],
        }
        for ep in endpoints
    ]
    from flight_gateway.protocol.trace_context import current_traceparent

    reader = spark.read.format("harness-flight").option("uri", uri).option("table", table)
    if token:
        reader = reader.option("token", token)
    parent = current_traceparent()
    if parent:  # the tasks' reads join the caller's trace
        reader = reader.option("traceparent", parent)
    return reader.option("endpoints", json.dumps(listed))


def read_native(
    spark: Any,
    uri: str,
    table: str,
    *,
    version: int | None = None,
    columns: Sequence[str] | None = None,
    filter: str | None = None,
    token: str | None = None,
) -> Any:
    """A DataFrame of ``table`` at one pinned version: cold files through Spark's native
    readers, everything else through ``harness-flight`` (module docstring). ``uri`` may list
    replicas after the first, comma-separated."""
    from spark_datasource.common import client as connect

    with connect({"uri": uri, "token": token or ""}) as client:
        info = client.flight_info(
            table, version=version, columns=columns, filter=filter, direct=True
        )
        pinned = client.pinned_version(info)
        direct: list[tuple[Any, Any]] = []
        flight: list[tuple[Any, Any]] = []
        for ep in info.endpoints:
            task = client.direct_task(ep)
            (direct if task is not None and task.format in ("parquet", "orc") else flight).append(
                (ep, task)
            )
    frames = _direct_frames(spark, [t for _, t in direct])
    native_reads = len(frames)
    if flight or not frames:
        # The Flight half: the same plan's other endpoints, schema of the pinned projection.
        # (Skipped when every task is direct: an empty Python source still costs a worker.)
        reader = _flight_frame(spark, uri, table, token, [ep for ep, _ in flight])
        reader = reader.option("version", str(pinned))
        if columns:
            reader = reader.option("columns", ",".join(columns))
        frames.insert(0, reader.load())
    log.info(
        "native read of %s@%d: %d direct task(s) in %d native read(s), %d Flight endpoint(s)",
        table,
        pinned,
        len(direct),
        native_reads,
        len(flight),
    )
    result = frames[0]
    for df in frames[1:]:
        result = result.unionByName(df)
    return result


def register_native_view(spark: Any, name: str, uri: str, table: str, **kwargs: Any) -> Any:
    """``read_native`` as a temporary view for Spark SQL; returns the DataFrame."""
    df = read_native(spark, uri, table, **kwargs)
    df.createOrReplaceTempView(name)
    return df
