"""NUMERIC columns of a declared precision up to 18 digits, read as exact Arrow decimals.

A ``numeric(p,s)`` value with ``0 <= s <= p <= 18`` is an integer of at most 18 digits once
multiplied by ``10**s``, and 10**18 - 1 < 2**63: the server sends ``(value * 10**s)::int8``
(exact: a value of the column has at most ``s`` decimals), the driver decodes 64-bit integers
natively, and the decimal128 values are those integers sign-extended to 16 bytes (numpy, no
per-value Python). Other NUMERIC (no declared precision, wider, or a negative scale) travels as
text and is cast by Arrow (``planners.postgres._output``).

Measured on TPC-DS SF 0.01 ``store_sales`` (28,810 rows, twelve numeric(7,2) columns of 24), the
gateway's read as a slice makes it, 30 rounds alternating both ways in one process on a busy
2-core machine: text and Arrow's cast 185.7 ms median (78.7 ms of the gateway's CPU), 64-bit
integers and this conversion 160.5 ms (62.0 ms). The server pays about as much for the
multiplication as for formatting text; what goes is the driver's strings and Arrow's parse.
PostgreSQL's COPY of the rows is most of either way: ADBC alone read the same rows with the
twelve columns left out in 94 ms against 143 ms with them as text (15 rounds, same hour).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flight_gateway.protocol.errors import InvalidArgument

#: The widest NUMERIC whose unscaled values all fit a signed 64-bit integer.
MAX_PRECISION = 18
_DECLARED = re.compile(r"numeric\((\d+),(\d+)\)")


def unscaled(data_type: str) -> tuple[int, int] | None:
    """(precision, scale) of a ``numeric(p,s)`` type (as ``format_type`` writes it) read as
    unscaled 64-bit integers; None for any other type, which keeps its own way."""
    m = _DECLARED.fullmatch(data_type)
    if m is None or sys.byteorder != "little":  # decimal128 is built little-endian below
        return None
    precision, scale = int(m.group(1)), int(m.group(2))
    return (precision, scale) if 0 <= scale <= precision <= MAX_PRECISION else None


def output(column: str, alias: str, scale: int) -> str:
    """SQL sending ``column`` (a numeric of ``scale``) as its unscaled 64-bit integer."""
    value = f"({column} * 1{'0' * scale})" if scale else column
    return f"{value}::int8 AS {alias}"


def to_decimal(values: pa.Array, precision: int, scale: int) -> pa.Array:
    """64-bit unscaled integers as decimal128(``precision``, ``scale``) with the same nulls:
    each 16-byte value is the integer (low 8 bytes) and its sign (high 8 bytes)."""
    if not pa.types.is_int64(values.type):
        raise InvalidArgument(f"expected the unscaled values as int64, got {values.type}")
    low_high = pc.min_max(values)
    bound = 10**precision
    if low_high["min"].is_valid and not (
        -bound < low_high["min"].as_py() and low_high["max"].as_py() < bound
    ):
        raise InvalidArgument(f"a value does not fit decimal128({precision}, {scale})")
    n = values.offset + len(values)
    ints = np.frombuffer(values.buffers()[1], dtype="<i8", count=n)
    wide = np.empty((n, 2), dtype="<i8")
    wide[:, 0] = ints
    wide[:, 1] = ints >> 63
    return pa.Array.from_buffers(
        pa.decimal128(precision, scale),
        len(values),
        [values.buffers()[0], pa.py_buffer(wide)],
        null_count=values.null_count,
        offset=values.offset,
    )


def decoded(
    reader: pa.RecordBatchReader, columns: Mapping[str, tuple[int, int]]
) -> pa.RecordBatchReader:
    """``reader`` with each of ``columns`` (name -> (precision, scale), sent by ``output``)
    turned back into decimals; ``reader`` itself when there are none."""
    present = {n: ps for n, ps in columns.items() if reader.schema.get_field_index(n) >= 0}
    if not present:
        return reader
    fields = [
        f.with_type(pa.decimal128(*present[f.name])) if f.name in present else f
        for f in reader.schema
    ]
    schema = pa.schema(fields, metadata=reader.schema.metadata)

    def gen() -> Iterator[pa.RecordBatch]:
        for batch in reader:
            arrays = [
                to_decimal(col, *present[name]) if name in present else col
                for name, col in zip(batch.schema.names, batch.columns, strict=True)
            ]
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)

    return pa.RecordBatchReader.from_batches(schema, gen())
