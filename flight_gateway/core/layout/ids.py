"""Parquet field ids of a version's columns: the harness's stable column ids at the top level,
and for the children of nested columns ids derived from their column's id alone (so a column's
ids never depend on the other columns, and slices made for one version fit the next)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from planners.kind import ColumnSpec

FIELD_ID = b"PARQUET:field_id"
#: Children of column ``c`` get ids ``NESTED_BASE + c * NESTED_PER_COLUMN + k``.
NESTED_BASE = 1 << 24
NESTED_PER_COLUMN = 4096


def _with_id(f: pa.Field, fid: int) -> pa.Field:
    return f.with_metadata({**(f.metadata or {}), FIELD_ID: str(fid).encode()})


def _nested(t: pa.DataType, ids: Iterator[int]) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct([_child(t.field(i), ids) for i in range(t.num_fields)])
    if pa.types.is_large_list(t):
        return pa.large_list(_child(t.value_field, ids))
    if pa.types.is_list(t):
        return pa.list_(_child(t.value_field, ids))
    if pa.types.is_map(t):
        return pa.map_(_child(t.key_field, ids), _child(t.item_field, ids))
    return t


def _child(f: pa.Field, ids: Iterator[int]) -> pa.Field:
    fid = next(ids)
    return _with_id(pa.field(f.name, _nested(f.type, ids), nullable=True), fid)


def arrow_with_ids(columns: Sequence[ColumnSpec]) -> pa.Schema:
    """The columns as an Arrow schema whose fields (nested ones too) carry Parquet field ids;
    every field nullable (a source may lack a column)."""
    out = []
    for c in columns:
        ids = iter(range(NESTED_BASE + c.field_id * NESTED_PER_COLUMN, 1 << 62))
        out.append(
            _with_id(pa.field(c.name, _nested(c.arrow_type, ids), nullable=True), c.field_id)
        )
    return pa.schema(out)
