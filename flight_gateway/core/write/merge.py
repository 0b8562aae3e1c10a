"""DoPut with row operations (descriptor ``"mode": "merge"``): each row is an upsert or, with
``_op = 'delete'``, a delete of its primary key. Rows apply in upload order, so the last
operation on a key wins and a key updated several times in one upload lands once (the
"duplicate trap" of streamed updates: no older insert survives)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from flight_gateway.catalog import TableSnapshot
from flight_gateway.protocol.errors import InvalidArgument

OP_COLUMN = "_op"
UPSERT, DELETE = "upsert", "delete"


def mode(command: Mapping[str, Any]) -> str:
    value = command.get("mode", "append")
    if value not in ("append", "merge"):
        raise InvalidArgument(f"DoPut 'mode' must be 'append' or 'merge', not {value!r}")
    return str(value)


def with_ops(
    snap: TableSnapshot, data: pa.Table, validate: Callable[[TableSnapshot, pa.Table], pa.Table]
) -> pa.Table:
    """The validated rows plus their ``_op`` column (all upserts when it is absent)."""
    if not snap.primary_key:
        raise InvalidArgument(f"table {snap.table!r} has no primary_key: merge needs one")
    ops = None
    if OP_COLUMN in data.column_names:
        ops = data.column(OP_COLUMN)
        data = data.drop_columns([OP_COLUMN])
    rows = validate(snap, data)
    for k in snap.primary_key:
        if rows.column(k).null_count:
            raise InvalidArgument(f"primary key column {k!r} has no value in some rows")
    if ops is None:
        ops = pa.array([UPSERT] * rows.num_rows, pa.string())
    else:
        try:
            ops = ops.cast(pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidArgument(f"'{OP_COLUMN}' must be text ('upsert' or 'delete')") from e
        bad = pc.invert(pc.fill_null(pc.is_in(ops, pa.array([UPSERT, DELETE])), False))
        if pc.any(bad).as_py():
            first = ops.filter(bad)[0].as_py()
            raise InvalidArgument(f"'{OP_COLUMN}' must be 'upsert' or 'delete', not {first!r}")
    return rows.append_column(OP_COLUMN, ops)


def last_per_key(part: pa.Table, key: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """(upserts, deletes) of one source's rows: the last operation per key only; deletes keep
    the key columns."""
    order = "__harness_row"
    numbered = part.append_column(order, pa.array(range(part.num_rows), pa.int64()))
    last = numbered.group_by(list(key), use_threads=False).aggregate([(order, "max")])
    rows = last.column(f"{order}_max")
    final = part.take(rows.take(pc.array_sort_indices(rows)))  # upload order kept
    is_delete = pc.equal(final.column(OP_COLUMN), DELETE)
    upserts = final.filter(pc.invert(is_delete)).drop_columns([OP_COLUMN])
    deletes = final.filter(is_delete).select(list(key))
    return upserts, deletes
