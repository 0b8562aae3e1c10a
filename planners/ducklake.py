"""``ducklake`` sources: a DuckLake table read ``AT (VERSION => snapshot_id)`` through DuckDB.

Config: ``metadata`` (what follows ``ducklake:`` in ATTACH: a DuckDB file, ``sqlite:path`` or
``postgres:dsn``), ``data_path``, ``table`` and optional ``schema`` (default ``main``).
State: ``{"snapshot_id": int}``. Projection and the whole predicate go into the SQL (quoted
identifiers, bound parameters), so DuckDB filters exactly and streams Arrow batches.
Schema changes: ``ALTER TABLE`` (additive part only). Writes (DoPut, moves): appends and
merges by key, one snapshot each, idempotent by commit id (kept in the snapshot's commit info).
A pinned snapshot is its data files in place (``layout``, DESIGN §16) when they hold exactly its
rows: no delete files, no rows or deletes ever inlined in the metadata, no partitioning, no
column default older files would read as; otherwise the gateway slices it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flight_gateway.protocol import operations as ops
from flight_gateway.protocol.errors import HarnessError, InvalidArgument, Unavailable
from planners import ducklake_files, ducklake_pool, locations
from planners.common import (
    DEFAULT_BATCH_ROWS,
    apply_residual,
    closing,
    conform,
    empty_reader,
    physical_names,
    pushdown,
    to_physical,
)
from planners.kind import (
    Additive,
    AppendContext,
    Reach,
    ScanRequest,
    ScanTask,
    SourceConfig,
    SourceKind,
    SourceRef,
)
from planners.layout import FileLayout
from planners.predicates import quote_ident, to_sql
from planners.sqltypes import sql_type


@dataclass(frozen=True, kw_only=True)
class DuckLakeConfig(SourceConfig):
    metadata: str
    table: str
    data_path: str | None = None
    schema: str = "main"


def connect(config: Mapping[str, Any], *, read_only: bool = True) -> Any:
    """A DuckDB connection with the lake attached as ``lake`` (extensions loaded offline);
    read-only, one of the databases ``ducklake_pool`` keeps (its ``close`` gives it back)."""
    metadata, data_path = config.get("metadata"), config.get("data_path")
    if not isinstance(metadata, str) or not metadata:
        raise InvalidArgument("ducklake source config needs 'metadata'")
    con = ducklake_pool.take(_database) if read_only else _database()
    try:
        # ATTACH takes no bind parameters: quote the (catalog-configured) paths as literals.
        options = [f"DATA_PATH {_literal(str(data_path))}"] if data_path else []
        if read_only:
            options.append("READ_ONLY")
        path = _literal("ducklake:" + metadata)
        opts = f" ({', '.join(options)})" if options else ""
        con.execute(f"ATTACH {path} AS lake{opts}")
    except Exception as e:
        con.close()
        raise Unavailable(f"cannot attach DuckLake {metadata!r}: {e}") from e
    return ducklake_pool.Pooled(con, "lake") if read_only else con


def _database() -> Any:
    """A DuckDB database with the extensions a lake's metadata may need loaded (offline)."""
    import duckdb
    import duckdb_extensions

    con = duckdb.connect(
        config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    )
    try:
        for name in ("ducklake", "sqlite", "postgres"):
            duckdb_extensions.import_extension(name, con=con)
    except Exception:
        con.close()
        raise
    return con


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def table_ref(config: Mapping[str, Any]) -> str:
    table = config.get("table")
    if not isinstance(table, str) or not table:
        raise InvalidArgument("ducklake source config needs 'table'")
    return f"lake.{quote_ident(str(config.get('schema', 'main')))}.{quote_ident(table)}"


def _snapshot(source: str, state: Mapping[str, Any]) -> int | None:
    snap = state.get("snapshot_id")
    if snap is not None and (isinstance(snap, bool) or not isinstance(snap, int)):
        raise InvalidArgument(f"source {source!r}: snapshot_id must be an integer, got {snap!r}")
    return snap


def _committed(con: Any, pinned: int | None, commit_id: str) -> int | None:
    """The snapshot after ``pinned`` that a harness write of ``commit_id`` made, if any."""
    rows = con.execute(
        "SELECT snapshot_id, commit_extra_info FROM lake.snapshots() WHERE snapshot_id > ? "
        "AND author = 'harness' ORDER BY snapshot_id",
        [pinned if pinned is not None else -1],
    ).fetchall()
    for snapshot_id, extra in rows:
        try:
            info = json.loads(extra or "{}")
        except ValueError:
            continue
        if isinstance(info, dict) and info.get(ops.SNAP_COMMIT_ID) == commit_id:
            return int(snapshot_id)
    return None


def _files(con: Any, config: Mapping[str, Any], snap: int) -> list[str]:
    """The data and delete files DuckDB will open for the table at ``snap`` (the lake's
    metadata lists them; they may lie anywhere, not only under ``data_path``)."""
    table = ducklake_files.table_id(con, config, snap)
    if table is None:
        return []  # no such table at ``snap``: the read itself says so
    return [f for row in ducklake_files.listed(con, table, snap) for f in (row[0], row[2]) if f]


class DuckLakeKind(SourceKind):
    config_model = DuckLakeConfig
    keyed_store = True

    def validate_state(self, name: str, state: Mapping[str, Any]) -> None:
        _snapshot(name, state)

    def reaches(self, source: SourceRef) -> list[Reach]:
        config: DuckLakeConfig = self.parse_config(source)
        meta = config.metadata
        if meta.startswith("postgres:"):
            from planners.postgres import dsn_reaches

            out = dsn_reaches(meta[len("postgres:") :], "metadata")
        else:
            out = locations.storage("metadata", meta.removeprefix("sqlite:"))
        if config.data_path:
            out += locations.storage("data_path", config.data_path)
        return out

    def warm(self) -> None:
        """A lake with SQLite metadata in memory, so nothing is written (its data path is
        never created) and the SQLite scanner's set-up is paid too: after an in-memory
        DuckDB-backed lake (~0.12 s) the first attach of a SQLite-backed one still took
        ~0.1 s (the TPC-DS first run's first statement waited for it); after this one
        (0.17-0.21 s), 3 ms. A lake with its metadata in PostgreSQL still pays that
        scanner's set-up on its first attach."""
        nowhere = os.path.join(tempfile.gettempdir(), f"harness-ducklake-warm-{os.getpid()}", "")
        attach = (
            f"ATTACH {_literal('ducklake:sqlite::memory:')} AS __warm "
            f"(DATA_PATH {_literal(nowhere)})"
        )
        ducklake_pool.warm(_database, attach)

    def plan(self, request: ScanRequest) -> list[ScanTask]:
        src = request.source
        if _snapshot(src.name, src.state) is None:
            return []
        return [ScanTask(src.name, {}, exact_filter=True)]

    def layout(self, request: ScanRequest) -> FileLayout | None:
        """The pinned snapshot's data files in place, columns by DuckLake's column ids (the
        files' field ids); None when the files are not exactly its rows
        (``ducklake_files.layout``)."""
        src = request.source
        snap = _snapshot(src.name, src.state)
        if snap is None:
            return FileLayout((), {})
        self.parse_config(src)
        con = connect(src.config)
        try:
            at = f"{table_ref(src.config)} AT (VERSION => {int(snap)})"
            return ducklake_files.layout(con, request, snap, at)
        finally:
            con.close()

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        src = request.source
        cols = request.columns
        snap = _snapshot(src.name, src.state)
        if snap is None:
            return empty_reader(cols)
        self.parse_config(src)
        con = connect(src.config)
        try:
            request.check_files("data file", _files(con, src.config, snap))
            at = f"{table_ref(src.config)} AT (VERSION => {int(snap)})"
            available = [d[0] for d in con.execute(f"SELECT * FROM {at} LIMIT 0").description]
            mapping = physical_names(cols, available)
            pred = pushdown(request, mapping)
            select = (
                ", ".join(quote_ident(p) for p in sorted(set(mapping.values()))) or "NULL AS _none"
            )
            sql = f"SELECT {select} FROM {at}"
            params: list[Any] = []
            if pred is not None:
                where, params = to_sql(pred, "?")
                sql += f" WHERE {where}"
            if request.limit is not None and (request.predicate is None or pred is not None):
                sql += f" LIMIT {int(request.limit)}"
            reader = con.execute(sql, params).to_arrow_reader(DEFAULT_BATCH_ROWS)
        except Exception:
            con.close()
            raise
        out = conform(closing(reader, con), cols, mapping)
        if request.predicate is not None and pred is None:
            out = apply_residual(out, request.predicate)
        return out

    # ------------------------------------------------------------------ writing

    def append(self, ctx: AppendContext, rows: pa.Table) -> dict[str, Any]:
        return self.merge(ctx, rows, rows.slice(0, 0), ())

    def merge(
        self, ctx: AppendContext, upserts: pa.Table, deletes: pa.Table, key: Sequence[str]
    ) -> dict[str, Any]:
        """One DuckLake snapshot: the rows of every key touched deleted, the upserts inserted
        (no key: a plain insert). The snapshot carries the commit id in its commit info, so a
        retry of the same commit finds it instead of writing again."""
        src = ctx.source
        con = connect(src.config, read_only=False)
        try:
            found = _committed(con, _snapshot(src.name, src.state), ctx.commit_id)
            if found is not None:
                return {**src.state, "snapshot_id": found}
            target = table_ref(src.config)
            names = [d[0] for d in con.execute(f"SELECT * FROM {target} LIMIT 0").description]
            data = to_physical(upserts, names, ctx.aliases)
            con.execute("BEGIN")
            if key:
                touched = pa.concat_tables([upserts.select(list(key)), deletes.select(list(key))])
                con.register("harness_keys", to_physical(touched, names, ctx.aliases))
                phys = to_physical(pa.table({k: [] for k in key}), names, ctx.aliases).column_names
                on = " AND ".join(f"{target}.{quote_ident(k)} = k.{quote_ident(k)}" for k in phys)
                con.execute(f"DELETE FROM {target} USING harness_keys k WHERE {on}")
            if data.num_rows:
                con.register("harness_rows", data)
                cols = ", ".join(quote_ident(c) for c in data.column_names)
                con.execute(f"INSERT INTO {target} ({cols}) SELECT {cols} FROM harness_rows")
            info = json.dumps(ops.write_properties(ctx.commit_id, ctx.relocation))
            con.execute("CALL lake.set_commit_message('harness', ?, extra_info => ?)",
                        [ctx.commit_id, info])  # fmt: skip
            con.execute("COMMIT")
            snap = con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()
            return {**src.state, "snapshot_id": int(snap[0])}
        except Exception as e:
            with contextlib.suppress(Exception):
                con.execute("ROLLBACK")
            if isinstance(e, HarnessError):
                raise
            raise Unavailable(f"source {src.name!r}: the DuckLake write failed: {e}") from e
        finally:
            con.close()

    def apply_additive(self, source: SourceRef, changes: Sequence[Additive]) -> None:
        con = connect(source.config, read_only=False)
        try:
            target = table_ref(source.config)
            existing = {d[0] for d in con.execute(f"SELECT * FROM {target} LIMIT 0").description}
            for c in changes:
                col_type = sql_type(c.type, postgres=False)
                phys = next((n for n in c.names if n in existing), None)
                if c.op == "add" and phys is None:
                    con.execute(
                        f"ALTER TABLE {target} ADD COLUMN {quote_ident(c.names[0])} {col_type}"
                    )
                elif c.op == "widen" and phys is not None:
                    con.execute(f"ALTER TABLE {target} ALTER {quote_ident(phys)} TYPE {col_type}")
        finally:
            con.close()
