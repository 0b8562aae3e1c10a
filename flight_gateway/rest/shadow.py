"""Pinned harness versions as Iceberg snapshots, written by pyiceberg itself.

Each harness table has a gateway-owned Iceberg table (a pyiceberg SQL catalog under the cache
directory). Loading a version the first time writes that version's rows, as the gateway reads
them (pinned, every source's state of that version, deletes applied), as Parquet files in the
cache, and commits them as one snapshot replacing the previous one, with the harness version
in its summary. A pinned version never changes, so every later load of it reuses the snapshot;
engines time travel by snapshot id (``versions`` maps harness versions to snapshot ids).

What this trades: every source's slice is copied once per version loaded (cold files included),
so the first load of a version costs a full read; later loads cost only metadata.
"""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from flight_gateway.protocol import ReadRequest
from flight_gateway.server.read import ReadService

log = logging.getLogger(__name__)
NAMESPACE = "harness"
VERSION_PROPERTY = "harness.version"


class Shadows:
    def __init__(self, reads: ReadService, root: Path) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        self.reads = reads
        self.root = root
        (root / "warehouse").mkdir(parents=True, exist_ok=True)
        self.catalog = SqlCatalog(
            "harness-rest",
            uri=f"sqlite:///{root / 'shadow.db'}",
            warehouse=f"file://{root / 'warehouse'}",
        )
        self.catalog.create_namespace_if_not_exists(NAMESPACE)
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, table: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(table, threading.Lock())

    def load(self, table: str, version: int | None = None) -> Any:
        """The shadow Iceberg table whose current snapshot is ``table`` at ``version`` (None:
        the latest); earlier loaded versions stay in its history."""
        snap = self.reads.snapshot(table, version)
        with self._lock(table):
            itable = self._table(table, snap)
            found = self.versions(itable).get(snap.version)
            if found is None:
                self._materialize(itable, table, snap.version)
                itable.refresh()
            elif itable.current_snapshot().snapshot_id != found:
                with itable.manage_snapshots() as ms:  # make the pinned version current
                    ms.set_current_snapshot(found)
                itable.refresh()
            return itable

    @staticmethod
    def versions(itable: Any) -> dict[int, int]:
        """harness version -> snapshot id of the versions materialized so far."""
        out = {}
        for s in itable.metadata.snapshots:
            v = s.summary.additional_properties.get(VERSION_PROPERTY) if s.summary else None
            if v is not None:
                out[int(v)] = s.snapshot_id
        return out

    def _table(self, table: str, snap: Any) -> Any:
        from pyiceberg.exceptions import NoSuchTableError

        from flight_gateway.server.read import arrow_schema

        ident = f"{NAMESPACE}.{table}"
        schema = _optional(arrow_schema(snap.schema, [f.name for f in snap.schema.fields]))
        try:
            itable = self.catalog.load_table(ident)
        except NoSuchTableError:
            return self.catalog.create_table(ident, schema=schema)
        names = set(itable.schema().column_names)
        if set(schema.names) - names:  # the harness schema grew: so does the shadow's
            with itable.update_schema() as update:
                update.union_by_name(schema)
            itable.refresh()
        return itable

    def _materialize(self, itable: Any, table: str, version: int) -> None:
        planned = self.reads.plan(ReadRequest(table=table, version=version))
        out = self.root / "data" / table / f"v{version}-{uuid.uuid4().hex[:8]}"
        out.mkdir(parents=True, exist_ok=True)
        files = []
        for i, ep in enumerate(planned.endpoints):
            payload = self.reads.verify(ep.ticket, "")
            data = self.reads.open(payload).read_all()
            if data.num_rows:
                path = out / f"part-{i:05d}.parquet"
                pq.write_table(_optional_table(data), path)
                files.append(f"file://{path}")
        props = {VERSION_PROPERTY: str(version)}
        with itable.transaction() as tx:
            from pyiceberg.expressions import AlwaysTrue

            tx.delete(AlwaysTrue(), snapshot_properties=props)
            if files:
                tx.add_files(files, snapshot_properties=props)
        log.info("iceberg rest: %s@%d materialized as %d file(s)", table, version, len(files))


def _optional(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema])


def _optional_table(data: pa.Table) -> pa.Table:
    return data.cast(_optional(data.schema))
