"""Uploaded batches with their buffers aligned for Acero.

gRPC hands a DoPut's message bodies to pyarrow's IPC reader zero-copy at whatever offset they
landed, and a Python Flight server cannot ask that reader to realign (the client can:
``IpcReadOptions.ensure_alignment``). Acero (``group_by`` in merges, joins) then warns once per
column and batch that an input buffer was poorly aligned. Here only the columns with a
misaligned buffer are copied (into Arrow's 64-byte aligned memory), by the rule Acero checks:
each value buffer aligned to its element's width (8 at most), offsets to 4 or 8, bitmaps and
string bytes to 1.
"""

from __future__ import annotations

import pyarrow as pa


def _required(t: pa.DataType, index: int) -> int:
    """The alignment buffer ``index`` of an array of type ``t`` needs (validity: 1)."""
    if index == 0:
        return 1
    if pa.types.is_boolean(t):
        return 1
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return 4 if index == 1 else 1
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return 8 if index == 1 else 1
    try:
        width = t.bit_width // 8
    except ValueError:  # nested and other non-fixed-width types: be strict
        return 8
    return max(1, min(width, 8))


def _misaligned(arr: pa.Array) -> bool:
    t = arr.type
    if pa.types.is_nested(t) or pa.types.is_dictionary(t):
        return any(b is not None and b.address % 8 for b in arr.buffers()[1:])
    return any(b is not None and b.address % _required(t, i) for i, b in enumerate(arr.buffers()))


def aligned(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` itself when every buffer is aligned, else with its misaligned columns copied."""
    columns = list(batch.columns)
    changed = False
    for i, col in enumerate(columns):
        if _misaligned(col):
            columns[i] = pa.concat_arrays([col])
            changed = True
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema) if changed else batch
