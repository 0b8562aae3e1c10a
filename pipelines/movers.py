"""Movers: move rows from a hot source to a cold one, visible exactly once at every version.

Each mover is lock-based (it holds the harness lock on every source it changes), restartable
and idempotent. A mover killed at any step and started again neither duplicates nor loses rows:

- Until the harness commit, readers are pinned to the old states, so nothing done so far is
  visible (an Iceberg append is an unreferenced snapshot, a Postgres write is newer than the
  pinned ``as_of``).
- Every Iceberg append made by a mover carries snapshot properties
  (``flight_gateway.protocol.operations.mover_properties``: the harness table, the hot source,
  the moved range). Before moving, a mover *adopts* such orphaned appends, the snapshots after
  the pinned one, by committing them with the source states they imply, instead of appending
  the same rows again.
- Mover commits are relocations (``operations.relocation_summary``): streaming readers saw the
  rows when they were first written and do not see them again.
- Harness commits use deterministic commit ids, so repeating one applies nothing twice.

``HARNESS_FAULT_INJECT=<step>`` makes the process exit abruptly at that step (kill tests).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from clients import HarnessClient
from flight_gateway.catalog.config import resolve_config
from flight_gateway.errors import Conflict
from flight_gateway.protocol import SourceInfo, TableInfo
from flight_gateway.protocol import operations as ops
from planners.iceberg import snapshot_properties
from planners.kafka.ranges import with_range

log = logging.getLogger(__name__)


#: Columns computed at read time, never stored in a target.
_METADATA = {"_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_kafka_key", "_source"}


def checkpoint(step: str) -> None:
    """Fault injection for kill tests: die here, as a SIGKILL would, when asked to."""
    if os.environ.get("HARNESS_FAULT_INJECT") == step:
        log.warning("fault injection: exiting at %s", step)
        os._exit(17)


@dataclass
class MoveResult:
    version: int | None
    rows: int
    adopted: list[int] = field(default_factory=list)  # orphaned Iceberg snapshots committed


def _iceberg_table(source: SourceInfo) -> Any:
    from planners.iceberg import load_table

    return load_table(resolve_config(source.config))


def _columns(desc: TableInfo, names: Sequence[str]) -> list[Any]:
    """Harness column specs (current name, former names) of ``names``."""
    from planners.kind import ColumnSpec

    return [ColumnSpec(f.id, f.name, f.type, f.aliases) for f in (desc.field(n) for n in names)]


def _snapshots_after(itable: Any, pinned: int | None) -> list[Any]:
    """Snapshots on the current lineage newer than ``pinned``, oldest first."""
    from planners.iceberg import lineage_after

    snaps, found = lineage_after(itable, pinned)
    if not found:
        raise Conflict(f"pinned Iceberg snapshot {pinned} is not an ancestor of the current one")
    return snaps


def _added_rows(itable: Any, snap: Any, columns: Sequence[str]) -> pa.Table:
    """``columns`` of the rows a snapshot added (its own data files), for adopting cold moves."""
    import pyarrow.dataset as ds

    from planners.common import filesystem
    from planners.iceberg import added_data_files

    paths = added_data_files(itable, snap)
    if not paths:
        return pa.table({c: pa.array([], pa.int64()) for c in columns})
    fs, _ = filesystem(paths[0])
    return ds.dataset([filesystem(p)[1] for p in paths], format="parquet", filesystem=fs).to_table(
        columns=list(columns)
    )


def _delete_keys(
    conn: Any, target: str, keys: Sequence[str], values: list[tuple[Any, ...]]
) -> None:
    """Delete the rows with these key values from ``target`` (a quoted table) in one transaction."""
    from planners.predicates import quote_ident

    key_list = ", ".join(quote_ident(k) for k in keys)
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(
            f"DELETE FROM {target} WHERE ({key_list}) = ({', '.join(['%s'] * len(keys))})", values
        )


class _Mover:
    def __init__(
        self,
        client: HarnessClient,
        table: str,
        hot: str,
        cold: str,
        *,
        owner: str,
        ttl_s: float = 120,
        wait_s: float = 120,
    ) -> None:
        self.client, self.table, self.hot, self.cold = client, table, hot, cold
        self.owner, self.ttl_s, self.wait_s = owner, ttl_s, wait_s

    def _locked(self, names: Sequence[str] | set[str]) -> Any:
        return self.client.lock(
            self.table, sorted(set(names)), owner=self.owner, ttl_s=self.ttl_s, wait_s=self.wait_s
        )


class KafkaToIcebergMover(_Mover):
    """Flush a Kafka source's ``[low, high)`` to an Iceberg source; commit the new snapshot and
    ``low = high`` in one harness commit (the manifesto's simple example)."""

    def run_once(self) -> MoveResult:
        held = {self.hot, self.cold}
        while True:
            with self._locked(held) as lock:
                desc = self.client.describe(self.table)
                self.pinned = desc  # what the data step reads (described under the lock)
                itable = _iceberg_table(desc.source(self.cold))
                orphans = [
                    (s, snapshot_properties(s))
                    for s in _snapshots_after(
                        itable, desc.source(self.cold).state.get("snapshot_id")
                    )
                ]
                orphan_sources = {
                    hot
                    for _, p in orphans
                    if p.get(ops.SNAP_TABLE) == self.table and (hot := ops.moved_from(p))
                }
                if not orphan_sources <= held:
                    held |= orphan_sources  # lock every source whose orphan we must adopt
                    continue
                return self._move(lock, desc, itable, orphans)

    def _append(
        self, itable: Any, desc: TableInfo, low: int, high: int, props: dict[str, str]
    ) -> int:
        """Append the hot source's [low, high) to the Iceberg table with ``props`` on the new
        snapshot; returns the row count. (The Spark pipeline reads and writes with Spark.)"""
        from planners.kafka import read_offsets

        schema = itable.schema().as_arrow()
        src = desc.source(self.hot)
        data = read_offsets(
            resolve_config(src.config),
            low,
            high,
            _columns(desc, schema.names),
            source=self.hot,
            skip=src.state.get("skip") or (),
        )
        checkpoint("kafka_iceberg.before_append")
        itable.append(data.cast(schema), snapshot_properties=props)
        return int(data.num_rows)

    def _adopt(
        self, desc: TableInfo, orphans: list[tuple[Any, dict[str, str]]]
    ) -> tuple[dict[str, dict[str, Any]], list[int]]:
        """New states of the hot sources whose orphaned appends are adopted."""
        updates: dict[str, dict[str, Any]] = {}
        adopted = []
        for snap, p in orphans:
            name = ops.moved_from(p)
            if p.get(ops.SNAP_TABLE) != self.table or name is None:
                continue
            lo, hi = int(p[ops.SNAP_LOW]), int(p[ops.SNAP_HIGH])
            state = updates.get(name) or desc.source(name).state
            if int(state.get("low", 0)) != lo:
                raise Conflict(
                    f"orphaned Iceberg snapshot {snap.snapshot_id} of {name} [{lo}, {hi}) does "
                    f"not continue its state (low {state.get('low')}); repair by hand"
                )
            updates[name] = with_range(state, hi, max(int(state.get("high", 0)), hi))
            adopted.append(snap.snapshot_id)
        return updates, adopted

    def _move(
        self,
        lock: Any,
        desc: TableInfo,
        itable: Any,
        orphans: list[tuple[Any, dict[str, str]]],
    ) -> MoveResult:
        updates, adopted = self._adopt(desc, orphans)
        hot_state = updates.get(self.hot) or desc.source(self.hot).state
        low, high = int(hot_state.get("low", 0)), int(desc.source(self.hot).state.get("high", 0))
        rows = 0
        tip = itable.current_snapshot().snapshot_id if itable.current_snapshot() else None
        if high > low:
            checkpoint("kafka_iceberg.before_read")
            props = ops.mover_properties(self.table, self.hot, low=str(low), high=str(high))
            rows = self._append(itable, desc, low, high, props)
            if rows > high - low:
                raise Conflict(f"read {rows} rows from [{low}, {high})")
            tip = itable.current_snapshot().snapshot_id
            updates[self.hot] = {"low": high, "high": high}
            checkpoint("kafka_iceberg.after_append")
        if not updates:
            return MoveResult(None, 0)
        version = self.client.commit(
            self.table,
            commit_id=f"move:{self.table}:{self.cold}:{tip}",
            lock=lock,
            updates=[{"source": self.cold, "state": {"snapshot_id": tip}}]
            + [{"source": n, "state": s} for n, s in updates.items()],
            summary=ops.relocation_summary("kafka-to-iceberg", rows=rows, adopted=adopted),
        )
        checkpoint("kafka_iceberg.after_commit")
        log.info(
            "moved %d rows %s -> %s (adopted %s) as version %d",
            rows,
            self.hot,
            self.cold,
            adopted,
            version,
        )
        return MoveResult(version, rows, adopted)


def _upsert_sql(target: str, names: Sequence[str], keys: Sequence[str]) -> str:
    from planners.predicates import quote_ident

    sets = ", ".join(
        f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in names if c not in keys
    )
    return (
        f"INSERT INTO {target} ({', '.join(quote_ident(c) for c in names)}) "
        f"VALUES ({', '.join(['%s'] * len(names))}) "
        f"ON CONFLICT ({', '.join(quote_ident(k) for k in keys)}) "
        + (f"DO UPDATE SET {sets}" if sets else "DO NOTHING")
    )


class KafkaToPostgresMover(_Mover):
    """Upsert a Kafka source's ``[low, high)`` into a versioned Postgres table by the table's
    primary key; commit ``low = high`` and the new ``as_of`` together (the medium example).
    Upserts are idempotent, so a killed run is simply repeated."""

    def _rows(self, desc: TableInfo, low: int, high: int) -> tuple[list[str], pa.Table]:
        """The stored columns and the rows of ``[low, high)``, tombstones stamped."""
        from planners.kafka import read_offsets

        names = [n for n in desc.column_names if n not in _METADATA]
        src = desc.source(self.hot)
        data = read_offsets(
            resolve_config(src.config),
            low,
            high,
            _columns(desc, names),
            source=self.hot,
            skip=src.state.get("skip") or (),
        )
        order_by = desc.properties.get("dedupe.order_by")
        if order_by in data.column_names:
            # Stamp tombstones with an ordering value while Kafka's order is still known:
            # in Postgres and Iceberg row order means nothing.
            from planners.dedupe import fill_order

            idx = data.column_names.index(order_by)
            data = data.set_column(idx, data.field(idx), fill_order(data.column(idx)))
        return names, data

    def run_once(self) -> MoveResult:
        import psycopg

        from planners.postgres import PostgresConfig
        from planners.postgres.versioning import server_now

        with self._locked([self.hot, self.cold]) as lock:
            desc = self.client.describe(self.table)
            state = desc.source(self.hot).state
            low, high = int(state.get("low", 0)), int(state.get("high", 0))
            if high <= low:
                return MoveResult(None, 0)
            keys = list(desc.primary_key)
            if not keys:
                raise Conflict(f"table {self.table!r} has no primary_key to upsert by")
            names, data = self._rows(desc, low, high)
            pg = PostgresConfig.parse(resolve_config(desc.source(self.cold).config), where="cold")
            # Later offsets win within the batch: keep the last row per key.
            latest = {tuple(r[k] for k in keys): r for r in data.to_pylist()}
            with psycopg.connect(pg.dsn) as conn:
                checkpoint("kafka_postgres.before_upsert")
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(
                        _upsert_sql(pg.qualified(), names, keys),
                        [tuple(r[c] for c in names) for r in latest.values()],
                    )
                checkpoint("kafka_postgres.after_upsert")
                as_of = server_now(conn)
            version = self.client.commit(
                self.table,
                commit_id=f"move:{self.table}:{self.hot}:{low}:{high}",
                lock=lock,
                updates=[
                    {"source": self.hot, "state": {"low": high, "high": high}},
                    {"source": self.cold, "state": {"as_of": as_of}},
                ],
                summary=ops.relocation_summary("kafka-to-postgres", rows=data.num_rows),
            )
            checkpoint("kafka_postgres.after_commit")
            return MoveResult(version, data.num_rows)


class PostgresToIcebergMover(_Mover):
    """Move rows of a versioned Postgres table (all, or those matching ``where``, a harness
    filter) to an Iceberg source: append, delete them from Postgres, commit the new snapshot and
    the new ``as_of`` in one harness commit (cold moves of the medium example)."""

    def __init__(
        self,
        client: HarnessClient,
        table: str,
        hot: str,
        cold: str,
        *,
        where: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(client, table, hot, cold, **kw)
        self.where = where

    def _move_rows(
        self,
        conn: Any,
        sql: str,
        params: list[Any],
        itable: Any,
        keys: list[str],
        props: dict[str, str],
        version: int,
    ) -> pa.Table:
        """Copy the rows ``sql`` selects into the Iceberg table (one append tagged ``props``);
        returns the moved rows' keys. (The Spark pipeline copies with Spark instead.)"""
        schema = itable.schema().as_arrow()
        with conn.transaction():
            rows = conn.execute(sql, params).fetchall()
        data = pa.Table.from_pylist(
            [dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema
        )
        if data.num_rows:
            checkpoint("postgres_iceberg.before_append")
            props = {**props, ops.SNAP_ROWS: str(data.num_rows)}
            itable.append(data, snapshot_properties=props)
            checkpoint("postgres_iceberg.after_append")
        return data.select(keys)

    def _select(self, desc: TableInfo, names: Sequence[str], target: str) -> tuple[str, list[Any]]:
        """The rows to move: all of them, or those matching ``where``."""
        from flight_gateway.arrow_types import parse_type
        from planners.predicates import parse_filter, quote_ident, to_sql

        sql = f"SELECT {', '.join(quote_ident(n) for n in names)} FROM {target}"
        if not self.where:
            return sql, []
        arrow = pa.schema([pa.field(f.name, parse_type(f.type)) for f in desc.schema])
        pred = parse_filter(self.where, arrow)
        if pred is None:
            return sql, []
        clause, params = to_sql(pred, "%s")
        return f"{sql} WHERE {clause}", params

    def run_once(self) -> MoveResult:
        import psycopg

        from planners.postgres import PostgresConfig
        from planners.postgres.versioning import server_now

        with self._locked([self.hot, self.cold]) as lock:
            desc = self.client.describe(self.table)
            keys = list(desc.primary_key)
            if not keys:
                raise Conflict(f"table {self.table!r} has no primary_key to move by")
            itable = _iceberg_table(desc.source(self.cold))
            pg = PostgresConfig.parse(resolve_config(desc.source(self.hot).config), where="hot")
            orphans = [
                s
                for s in _snapshots_after(itable, desc.source(self.cold).state.get("snapshot_id"))
                if snapshot_properties(s).get(ops.SNAP_TABLE) == self.table
                and ops.moved_from(snapshot_properties(s)) == self.hot
            ]
            with psycopg.connect(pg.dsn) as conn:
                # Adopt: rows an earlier, killed run already appended must leave Postgres now.
                for snap in orphans:
                    moved = _added_rows(itable, snap, keys)
                    _delete_keys(conn, pg.qualified(), keys, _key_values(moved, keys))
                sql, params = self._select(desc, itable.schema().as_arrow().names, pg.qualified())
                props = ops.mover_properties(self.table, self.hot)
                data = self._move_rows(conn, sql, params, itable, keys, props, desc.version)
                if data.num_rows:
                    _delete_keys(conn, pg.qualified(), keys, _key_values(data, keys))
                    checkpoint("postgres_iceberg.after_delete")
                if not data.num_rows and not orphans:
                    return MoveResult(None, 0)
                as_of = server_now(conn)
            tip = itable.current_snapshot().snapshot_id
            adopted = [s.snapshot_id for s in orphans]
            version = self.client.commit(
                self.table,
                commit_id=f"move:{self.table}:{self.cold}:{tip}",
                lock=lock,
                updates=[
                    {"source": self.cold, "state": {"snapshot_id": tip}},
                    {"source": self.hot, "state": {"as_of": as_of}},
                ],
                summary=ops.relocation_summary(
                    "postgres-to-iceberg", rows=data.num_rows, adopted=adopted
                ),
            )
            checkpoint("postgres_iceberg.after_commit")
            return MoveResult(version, data.num_rows, adopted)


def _key_values(data: pa.Table, keys: Sequence[str]) -> list[tuple[Any, ...]]:
    return [tuple(r[k] for k in keys) for r in data.select(list(keys)).to_pylist()]


def _upsert_into_lake(con: Any, lake: str, names: Sequence[str], keys: Sequence[str]) -> None:
    """Replace the rows of registered relation ``moving`` by key, in one DuckDB transaction (a
    repeat after a crash replaces the same keys again, never duplicates them)."""
    from planners.predicates import quote_ident

    on = " AND ".join(f"{lake}.{quote_ident(k)} = moving.{quote_ident(k)}" for k in keys)
    con.execute("BEGIN")
    con.execute(f"DELETE FROM {lake} USING moving WHERE {on}")
    con.execute(f"INSERT INTO {lake} SELECT {', '.join(quote_ident(n) for n in names)} FROM moving")
    con.execute("COMMIT")


class PostgresToDuckLakeMover(_Mover):
    """Move rows of a versioned Postgres table into a DuckLake table (the basement dweller's
    example): upsert them into the lake (delete the keys, insert, one DuckDB transaction, so a
    repeat never duplicates), delete them from Postgres, and commit the lake snapshot and the
    new ``as_of`` in one harness commit. A lake snapshot newer than the pinned one (an earlier
    run killed before its commit) is adopted."""

    def _move(self, con: Any, conn: Any, desc: TableInfo, lake: str, target: str) -> int:
        """Rows moved from Postgres (``conn``) into the lake (``con``)."""
        from planners.predicates import quote_ident

        names = [d[0] for d in con.execute(f"SELECT * FROM {lake} LIMIT 0").description]
        with conn.transaction():
            rows = conn.execute(
                f"SELECT {', '.join(quote_ident(n) for n in names)} FROM {target}"
            ).fetchall()
        if rows:
            con.register(
                "moving", pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows])
            )
            checkpoint("postgres_ducklake.before_lake")
            _upsert_into_lake(con, lake, names, desc.primary_key)
            checkpoint("postgres_ducklake.after_lake")
            keys = [names.index(k) for k in desc.primary_key]
            _delete_keys(conn, target, desc.primary_key, [tuple(r[i] for i in keys) for r in rows])
            checkpoint("postgres_ducklake.after_delete")
        return len(rows)

    def run_once(self) -> MoveResult:
        import psycopg

        from planners.ducklake import connect, table_ref
        from planners.postgres import PostgresConfig
        from planners.postgres.versioning import server_now

        with self._locked([self.hot, self.cold]) as lock:
            desc = self.client.describe(self.table)
            if not desc.primary_key:
                raise Conflict(f"table {self.table!r} has no primary_key to move by")
            lake_cfg = resolve_config(desc.source(self.cold).config)
            pg = PostgresConfig.parse(resolve_config(desc.source(self.hot).config), where="hot")
            con = connect(lake_cfg, read_only=False)
            try:
                with psycopg.connect(pg.dsn) as conn:
                    rows = self._move(con, conn, desc, table_ref(lake_cfg), pg.qualified())
                    snapshot = int(
                        con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0]
                    )
                    if not rows and snapshot == desc.source(self.cold).state.get("snapshot_id"):
                        return MoveResult(None, 0)
                    as_of = server_now(conn)
            finally:
                con.close()
            version = self.client.commit(
                self.table,
                commit_id=f"move:{self.table}:{self.cold}:{snapshot}",
                lock=lock,
                updates=[
                    {"source": self.cold, "state": {"snapshot_id": snapshot}},
                    {"source": self.hot, "state": {"as_of": as_of}},
                ],
                summary=ops.relocation_summary("postgres-to-ducklake", rows=rows),
            )
            checkpoint("postgres_ducklake.after_commit")
            return MoveResult(version, rows)


def _paimon_upsert(table: Any, rows: pa.Table, props: dict[str, str]) -> None:
    """Write ``rows`` into a Paimon primary-key table in one batch commit (a repeat after a crash
    writes the same keys again, which the table merges, never duplicates)."""
    from pypaimon.schema.data_types import PyarrowFieldParser

    schema = pa.schema(PyarrowFieldParser.from_paimon_schema(table.fields))
    builder = table.new_batch_write_builder()
    write, commit = builder.new_write(), builder.new_commit()
    try:
        write.write_arrow(rows.select(schema.names).cast(schema))
        commit.commit(write.prepare_commit(), snapshot_properties=props)
    finally:
        write.close()
        commit.close()


class PostgresToPaimonMover(_Mover):
    """Move the rows of a versioned Postgres table (a shard) into its partition of a Paimon
    primary-key table (the manifesto's expert example): upsert them into Paimon (one snapshot
    tagged as a relocation), delete them from Postgres, and commit the source's new snapshot and
    the shard's new ``as_of`` in one harness commit. A run killed before its harness commit is
    repaired by the next: rows still in Postgres are written again (merged by key), and a
    Paimon snapshot newer than the pinned one is adopted."""

    def _move(self, conn: Any, ptable: Any, target: str, keys: Sequence[str]) -> int:
        from planners.predicates import quote_ident

        names = [f.name for f in ptable.fields]
        with conn.transaction():
            rows = conn.execute(
                f"SELECT {', '.join(quote_ident(n) for n in names)} FROM {target}"
            ).fetchall()
        if not rows:
            return 0
        data = pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows])
        checkpoint("postgres_paimon.before_write")
        _paimon_upsert(ptable, data, ops.mover_properties(self.table, self.hot))
        checkpoint("postgres_paimon.after_write")
        _delete_keys(conn, target, keys, _key_values(data, keys))
        checkpoint("postgres_paimon.after_delete")
        return len(rows)

    def run_once(self) -> MoveResult:
        import psycopg

        from planners.paimon import PaimonConfig, load_table
        from planners.postgres import PostgresConfig
        from planners.postgres.versioning import server_now

        with self._locked([self.hot, self.cold]) as lock:
            desc = self.client.describe(self.table)
            if not desc.primary_key:
                raise Conflict(f"table {self.table!r} has no primary_key to move by")
            cold = desc.source(self.cold)
            ptable = load_table(PaimonConfig.parse(resolve_config(cold.config), where="cold"))
            pg = PostgresConfig.parse(resolve_config(desc.source(self.hot).config), where="hot")
            with psycopg.connect(pg.dsn) as conn:
                rows = self._move(conn, ptable, pg.qualified(), desc.primary_key)
                latest = ptable.snapshot_manager().get_latest_snapshot()
                snapshot = None if latest is None else int(latest.id)
                if not rows and snapshot == cold.state.get("snapshot_id"):
                    return MoveResult(None, 0)
                as_of = server_now(conn)
            version = self.client.commit(
                self.table,
                commit_id=f"move:{self.table}:{self.cold}:{snapshot}:{as_of}",
                lock=lock,
                updates=[
                    {"source": self.cold, "state": {"snapshot_id": snapshot}},
                    {"source": self.hot, "state": {"as_of": as_of}},
                ],
                summary=ops.relocation_summary("postgres-to-paimon", rows=rows),
            )
            checkpoint("postgres_paimon.after_commit")
            return MoveResult(version, rows)
