"""Avro object container files as Arrow record batches (fastavro decodes, Arrow types from the
file's own writer schema, so an empty file or a column of nulls still has its declared type)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from flight_gateway.protocol.errors import InvalidArgument

_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}

_LOGICAL: dict[str, pa.DataType] = {
    "date": pa.date32(),
    "time-millis": pa.time32("ms"),
    "time-micros": pa.time64("us"),
    "timestamp-millis": pa.timestamp("ms", tz="UTC"),
    "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "local-timestamp-millis": pa.timestamp("ms"),
    "local-timestamp-micros": pa.timestamp("us"),
    "uuid": pa.string(),
}


def _type(schema: Any) -> tuple[pa.DataType, bool]:
    """(Arrow type, nullable) of an Avro schema node."""
    if isinstance(schema, list):  # a union: ["null", X] is a nullable X
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise InvalidArgument(f"Avro unions other than [null, T] are not supported: {schema}")
        return _type(branches[0])[0], True
    if isinstance(schema, str):
        if schema not in _PRIMITIVES:
            raise InvalidArgument(f"Avro named type references are not supported: {schema!r}")
        return _PRIMITIVES[schema], schema == "null"
    logical = schema.get("logicalType")
    if logical == "decimal":
        return pa.decimal128(int(schema["precision"]), int(schema.get("scale", 0))), False
    if logical in _LOGICAL:
        return _LOGICAL[logical], False
    kind = schema["type"]
    if kind == "record":
        return pa.struct(_fields(schema)), False
    if kind == "array":
        return pa.list_(_type(schema["items"])[0]), False
    if kind == "map":
        return pa.map_(pa.string(), _type(schema["values"])[0]), False
    if kind == "enum":
        return pa.string(), False
    if kind == "fixed":
        return pa.binary(int(schema["size"])), False
    return _type(kind)


def _fields(record: dict[str, Any]) -> list[pa.Field]:
    out = []
    for f in record["fields"]:
        t, nullable = _type(f["type"])
        out.append(pa.field(f["name"], t, nullable=nullable))
    return out


def arrow_schema(writer_schema: Any) -> pa.Schema:
    if not isinstance(writer_schema, dict) or writer_schema.get("type") != "record":
        raise InvalidArgument("an Avro file must hold records to be read as a table")
    return pa.schema(_fields(writer_schema))


def read_avro(fs: pafs.FileSystem, path: str, batch_rows: int) -> pa.RecordBatchReader:
    """Batches of ``batch_rows`` records; the file is opened here and closed when read out."""
    import fastavro

    f = fs.open_input_file(path)
    try:
        records = fastavro.reader(f)
        schema = arrow_schema(records.writer_schema)
    except Exception:
        f.close()
        raise

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            buf: list[Any] = []
            for rec in records:
                buf.append(rec)
                if len(buf) >= batch_rows:
                    yield pa.RecordBatch.from_pylist(buf, schema=schema)
                    buf = []
            if buf:
                yield pa.RecordBatch.from_pylist(buf, schema=schema)
        finally:
            f.close()

    return pa.RecordBatchReader.from_batches(schema, batches())
