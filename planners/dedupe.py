"""The primary-key view: the latest row per key across the sources of one pinned version.

Rank of a row, highest wins: the source's tier (config ``tier``, else its kind's
``dedupe_tier``: data flows hot -> cold, so hotter kinds rank higher), then the table's ordering column (property
``dedupe.order_by``, e.g. ``updated_at`` or ``_kafka_offset``) when it has one, then the row's
position in its source (later files in the list, higher offsets, later rows). A row with no
ordering value takes the largest one before it in its source. A row whose
``_deleted`` column is true is a tombstone: it hides its key.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

_RANK = ("__tier", "__order", "__seq")


def fill_order(order: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A row with no ordering value (a Kafka null-value tombstone) is as new as the newest
    row before it in its source: position is the source's own chronology."""
    running = pc.fill_null_forward(pc.cumulative_max(order, skip_nulls=True))
    return pc.fill_null(order, running)


def with_rank(table: pa.Table, tier: int, seq_start: int, order_by: str | None) -> pa.Table:
    n = table.num_rows
    table = table.append_column("__tier", pa.array([tier] * n, pa.int32()))
    if order_by and order_by in table.column_names:
        table = table.append_column("__order", fill_order(table.column(order_by)))
    table = table.append_column("__seq", pa.array(range(seq_start, seq_start + n), pa.int64()))
    return table


def latest_per_key(parts: Sequence[pa.Table], keys: Sequence[str]) -> pa.Table:
    """Keep the highest-ranked row of every key and drop tombstones; rank columns removed."""
    tables = [p for p in parts if p.num_rows]
    if not tables:
        return (
            parts[0].drop_columns([c for c in _RANK if c in parts[0].column_names])
            if parts
            else pa.table({})
        )
    data = pa.concat_tables(tables, promote_options="default")
    rank = [c for c in _RANK if c in data.column_names]
    order = [(k, "ascending") for k in keys] + [(c, "descending") for c in rank]
    data = data.sort_by(order)
    data = data.append_column("__idx", pa.array(range(data.num_rows), pa.int64()))
    firsts = data.group_by(list(keys), use_threads=False).aggregate([("__idx", "min")])
    idx = firsts.column("__idx_min")
    data = data.take(pc.take(idx, pc.sort_indices(idx)))  # stable: sorted by key
    if "_deleted" in data.column_names:
        data = data.filter(pc.invert(pc.fill_null(data.column("_deleted"), False)))
    return data.drop_columns([*rank, "__idx"])
