"""pyiceberg transactions that build their table metadata once per staged state.

pyiceberg 0.12's ``Transaction.table_metadata`` replays the staged updates and deep-copies the
whole table metadata (every snapshot, the snapshot and metadata logs) on each read, and an
append reads it about 19 times. Measured on a table of 150 snapshots: 85 % of an append's time
(about 100 ms idle, seconds in a loaded gateway, where it is Python competing for the GIL), all
of it under the source's write lease, so every other writer of the source waited for it. Here
the metadata is built once per (table metadata, staged updates) pair: both are replaced, never
changed in place, when a transaction stages an update or its table is refreshed, so an identity
check keeps the answer current, and with nothing staged the answer is the table's metadata
itself. The same change was proposed upstream
(apache/iceberg-python#3302, approved, closed as stale; #3784).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from pyiceberg.table import Table
from pyiceberg.table import Transaction as _Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import update_table_metadata


class Transaction(_Transaction):
    _built: tuple[TableMetadata, Any, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        if not updates:  # nothing staged: the table's own (pyiceberg never changes it in place)
            return base
        built = self._built
        if built is None or built[0] is not base or built[1] is not updates:
            built = (base, updates, update_table_metadata(base, updates))
            self._built = built
        return built[2]


def transaction(table: Table) -> Transaction:
    """``table.transaction()``, with its metadata built once per staged state."""
    return Transaction(table)


def append(table: Table, data: pa.Table, snapshot_properties: Mapping[str, str]) -> None:
    """``table.append``, with its metadata built once per staged state."""
    with transaction(table) as tx:
        tx.append(data, snapshot_properties=dict(snapshot_properties))
