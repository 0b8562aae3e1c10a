"""Movers: move rows from a hot source to a cold one, visible exactly once at every version.

Each mover is lock-based (it holds the harness lock on every source it changes), restartable
and idempotent. A mover killed at any step and started again neither duplicates nor loses rows:

- Until the harness commit, readers are pinned to the old states, so nothing done so far is
  visible (an Iceberg append is an unreferenced snapshot, a Postgres write is newer than the
  pinned ``as_of``).
- Every Iceberg append made by a mover carries snapshot properties (``harness.table``,
  ``harness.source``, ``harness.low``/``harness.high`` or the moved keys). Before moving, a
  mover *adopts* such orphaned appends, the snapshots after the pinned one, by committing them
  with the source states they imply, instead of appending the same rows again.
- Harness commits use deterministic commit ids, so repeating one applies nothing twice.

``HARNESS_FAULT_INJECT=<step>`` makes the process exit abruptly at that step (kill tests).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from clients import HarnessClient
from flight_gateway.catalog.config import resolve_config
from flight_gateway.errors import Conflict
from planners.iceberg import snapshot_properties

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


def _sources(desc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in desc["sources"]}


def _iceberg_table(source: Mapping[str, Any]) -> Any:
    from planners.iceberg import load_table

    return load_table(resolve_config(source["config"]))


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

    from planners.files import filesystem
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
                self.pinned_version = int(desc["version"])
                self.pinned_schema = {f["name"]: f for f in desc["schema"]}
                srcs = _sources(desc)
                itable = _iceberg_table(srcs[self.cold])
                orphans = [
                    (s, snapshot_properties(s))
                    for s in _snapshots_after(itable, srcs[self.cold]["state"].get("snapshot_id"))
                ]
                orphan_sources = {
                    p["harness.source"]
                    for _, p in orphans
                    if p.get("harness.table") == self.table and "harness.source" in p
                }
                if not orphan_sources <= held:
                    held |= orphan_sources  # lock every source whose orphan we must adopt
                    continue
                return self._move(lock, srcs, itable, orphans)

    def _append(
        self,
        itable: Any,
        srcs: dict[str, dict[str, Any]],
        low: int,
        high: int,
        props: dict[str, str],
    ) -> int:
        """Append the hot source's [low, high) to the Iceberg table with ``props`` on the new
        snapshot; returns the row count. (The Spark pipeline reads and writes with Spark.)"""
        from planners.base import ColumnSpec
        from planners.kafka import read_offsets

        schema = itable.schema().as_arrow()
        harness = self.pinned_schema  # described under the lock in run_once
        cols = [
            ColumnSpec(
                harness[n]["id"], n, harness[n]["type"], tuple(harness[n].get("aliases", ()))
            )
            for n in schema.names
        ]
        data = read_offsets(
            resolve_config(srcs[self.hot]["config"]), low, high, cols, source=self.hot
        )
        checkpoint("kafka_iceberg.before_append")
        itable.append(data.cast(schema), snapshot_properties=props)
        return int(data.num_rows)

    def _move(
        self,
        lock: Any,
        srcs: dict[str, dict[str, Any]],
        itable: Any,
        orphans: list[tuple[Any, dict[str, str]]],
    ) -> MoveResult:
        lows = {n: int(s["state"].get("low", 0)) for n, s in srcs.items() if s["kind"] == "kafka"}
        updates: dict[str, dict[str, Any]] = {}
        adopted = []
        for snap, p in orphans:
            if p.get("harness.table") != self.table or "harness.source" not in p:
                continue
            name, lo, hi = p["harness.source"], int(p["harness.low"]), int(p["harness.high"])
            if lows.get(name) != lo:
                raise Conflict(
                    f"orphaned Iceberg snapshot {snap.snapshot_id} of {name} [{lo}, {hi}) does not continue its state (low {lows.get(name)}); repair by hand"
                )
            lows[name] = hi
            state = srcs[name]["state"]
            updates[name] = {"low": hi, "high": max(int(state.get("high", 0)), hi)}
            adopted.append(snap.snapshot_id)
        low = lows[self.hot]
        high = int(srcs[self.hot]["state"].get("high", 0))
        rows = 0
        tip = itable.current_snapshot().snapshot_id if itable.current_snapshot() else None
        if high > low:
            checkpoint("kafka_iceberg.before_read")
            props = {
                "harness.table": self.table,
                "harness.source": self.hot,
                "harness.low": str(low),
                "harness.high": str(high),
            }
            rows = self._append(itable, srcs, low, high, props)
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
            summary={"operation": "kafka-to-iceberg", "rows": rows, "adopted": adopted},
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


class KafkaToPostgresMover(_Mover):
    """Upsert a Kafka source's ``[low, high)`` into a versioned Postgres table by the table's
    primary key; commit ``low = high`` and the new ``as_of`` together (the medium example).
    Upserts are idempotent, so a killed run is simply repeated."""

    def run_once(self) -> MoveResult:
        import psycopg

        from planners.base import ColumnSpec
        from planners.kafka import read_offsets
        from planners.postgres import table_names
        from planners.postgres_versioning import server_now
        from planners.predicates import quote_ident

        with self._locked([self.hot, self.cold]) as lock:
            desc = self.client.describe(self.table)
            srcs = _sources(desc)
            low, high = (
                int(srcs[self.hot]["state"].get("low", 0)),
                int(srcs[self.hot]["state"].get("high", 0)),
            )
            if high <= low:
                return MoveResult(None, 0)
            keys = list(desc["primary_key"])
            if not keys:
                raise Conflict(f"table {self.table!r} has no primary_key to upsert by")
            cols = [
                ColumnSpec(f["id"], f["name"], f["type"], tuple(f.get("aliases", ())))
                for f in desc["schema"]
                if f["name"] not in _METADATA
            ]
            data = read_offsets(
                resolve_config(srcs[self.hot]["config"]), low, high, cols, source=self.hot
            )
            order_by = desc["properties"].get("dedupe.order_by")
            if order_by in data.column_names:
                # Stamp tombstones with an ordering value while Kafka's order is still known:
                # in Postgres and Iceberg row order means nothing.
                from planners.dedupe import fill_order

                idx = data.column_names.index(order_by)
                data = data.set_column(idx, data.field(idx), fill_order(data.column(idx)))
            pg_config = resolve_config(srcs[self.cold]["config"])
            schema, table, _ = table_names(pg_config)
            names = [c.name for c in cols]
            # Later offsets win within the batch: keep the last row per key.
            latest: dict[tuple[Any, ...], dict[str, Any]] = {}
            for row in data.to_pylist():
                latest[tuple(row[k] for k in keys)] = row
            target = f"{quote_ident(schema)}.{quote_ident(table)}"
            sets = ", ".join(
                f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in names if c not in keys
            )
            sql = (
                f"INSERT INTO {target} ({', '.join(quote_ident(c) for c in names)}) VALUES ({', '.join(['%s'] * len(names))}) "
                f"ON CONFLICT ({', '.join(quote_ident(k) for k in keys)}) "
                + (f"DO UPDATE SET {sets}" if sets else "DO NOTHING")
            )
            with psycopg.connect(pg_config["dsn"]) as conn:
                checkpoint("kafka_postgres.before_upsert")
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(sql, [tuple(r[c] for c in names) for r in latest.values()])
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
                summary={"operation": "kafka-to-postgres", "rows": data.num_rows},
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
            itable.append(data, snapshot_properties={**props, "harness.rows": str(data.num_rows)})
            checkpoint("postgres_iceberg.after_append")
        return data.select(keys)

    def run_once(self) -> MoveResult:
        import psycopg

        from planners.postgres import table_names
        from planners.postgres_versioning import server_now
        from planners.predicates import parse_filter, quote_ident, to_sql

        with self._locked([self.hot, self.cold]) as lock:
            desc = self.client.describe(self.table)
            srcs = _sources(desc)
            keys = list(desc["primary_key"])
            if not keys:
                raise Conflict(f"table {self.table!r} has no primary_key to move by")
            itable = _iceberg_table(srcs[self.cold])
            schema = itable.schema().as_arrow()
            pg_config = resolve_config(srcs[self.hot]["config"])
            pg_schema, pg_table, _ = table_names(pg_config)
            target = f"{quote_ident(pg_schema)}.{quote_ident(pg_table)}"
            orphans = [
                s
                for s in _snapshots_after(itable, srcs[self.cold]["state"].get("snapshot_id"))
                if snapshot_properties(s).get("harness.table") == self.table
                and snapshot_properties(s).get("harness.source") == self.hot
            ]
            with psycopg.connect(pg_config["dsn"]) as conn:
                # Adopt: rows an earlier, killed run already appended must leave Postgres now.
                for snap in orphans:
                    moved = _added_rows(itable, snap, keys)
                    _delete_keys(
                        conn, target, keys, [tuple(r[k] for k in keys) for r in moved.to_pylist()]
                    )
                sql = f"SELECT {', '.join(quote_ident(n) for n in schema.names)} FROM {target}"
                params: list[Any] = []
                if self.where:
                    from flight_gateway.arrow_types import parse_type

                    arrow = pa.schema(
                        [pa.field(f["name"], parse_type(f["type"])) for f in desc["schema"]]
                    )
                    pred = parse_filter(self.where, arrow)
                    if pred is not None:
                        clause, params = to_sql(pred, "%s")
                        sql += f" WHERE {clause}"
                props = {"harness.table": self.table, "harness.source": self.hot}
                data = self._move_rows(conn, sql, params, itable, keys, props, int(desc["version"]))
                if data.num_rows:
                    _delete_keys(
                        conn, target, keys, [tuple(r[k] for k in keys) for r in data.to_pylist()]
                    )
                    checkpoint("postgres_iceberg.after_delete")
                if not data.num_rows and not orphans:
                    return MoveResult(None, 0)
                as_of = server_now(conn)
            tip = itable.current_snapshot().snapshot_id
            version = self.client.commit(
                self.table,
                commit_id=f"move:{self.table}:{self.cold}:{tip}",
                lock=lock,
                updates=[
                    {"source": self.cold, "state": {"snapshot_id": tip}},
                    {"source": self.hot, "state": {"as_of": as_of}},
                ],
                summary={
                    "operation": "postgres-to-iceberg",
                    "rows": data.num_rows,
                    "adopted": [s.snapshot_id for s in orphans],
                },
            )
            checkpoint("postgres_iceberg.after_commit")
            return MoveResult(version, data.num_rows, [s.snapshot_id for s in orphans])


class PostgresToDuckLakeMover(_Mover):
    """Move rows of a versioned Postgres table into a DuckLake table (the basement dweller's
    example): upsert them into the lake (delete the keys, insert, one DuckDB transaction, so a
    repeat never duplicates), delete them from Postgres, and commit the lake snapshot and the
    new ``as_of`` in one harness commit. A lake snapshot newer than the pinned one (an earlier
    run killed before its commit) is adopted."""

    def run_once(self) -> MoveResult:
        import psycopg

        from planners.ducklake import connect, table_ref
        from planners.postgres import table_names
        from planners.postgres_versioning import server_now
        from planners.predicates import quote_ident

        with self._locked([self.hot, self.cold]) as lock:
            desc = self.client.describe(self.table)
            srcs = _sources(desc)
            keys = list(desc["primary_key"])
            if not keys:
                raise Conflict(f"table {self.table!r} has no primary_key to move by")
            lake_cfg = resolve_config(srcs[self.cold]["config"])
            pg_config = resolve_config(srcs[self.hot]["config"])
            pg_schema, pg_table, _ = table_names(pg_config)
            target = f"{quote_ident(pg_schema)}.{quote_ident(pg_table)}"
            con = connect(lake_cfg, read_only=False)
            try:
                lake = table_ref(lake_cfg)
                names = [d[0] for d in con.execute(f"SELECT * FROM {lake} LIMIT 0").description]
                with psycopg.connect(pg_config["dsn"]) as conn:
                    with conn.transaction():
                        rows = conn.execute(
                            f"SELECT {', '.join(quote_ident(n) for n in names)} FROM {target}"
                        ).fetchall()
                    if rows:
                        data = pa.Table.from_pylist(
                            [dict(zip(names, r, strict=True)) for r in rows]
                        )
                        con.register("moving", data)
                        checkpoint("postgres_ducklake.before_lake")
                        con.execute("BEGIN")
                        on = " AND ".join(
                            f"{lake}.{quote_ident(k)} = moving.{quote_ident(k)}" for k in keys
                        )
                        con.execute(f"DELETE FROM {lake} USING moving WHERE {on}")
                        con.execute(
                            f"INSERT INTO {lake} SELECT {', '.join(quote_ident(n) for n in names)} FROM moving"
                        )
                        con.execute("COMMIT")
                        checkpoint("postgres_ducklake.after_lake")
                        _delete_keys(
                            conn,
                            target,
                            keys,
                            [tuple(r[names.index(k)] for k in keys) for r in rows],
                        )
                        checkpoint("postgres_ducklake.after_delete")
                    snapshot = int(
                        con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0]
                    )
                    if not rows and snapshot == srcs[self.cold]["state"].get("snapshot_id"):
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
                summary={"operation": "postgres-to-ducklake", "rows": len(rows)},
            )
            checkpoint("postgres_ducklake.after_commit")
            return MoveResult(version, len(rows))
