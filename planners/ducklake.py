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
from planners import ducklake_pool, locations
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
from planners.layout import FileLayout, LaidFile, as_uri
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
    rows = con.execute(
        "SELECT data_file, delete_file FROM ducklake_list_files('lake', ?, schema => ?, "
        "snapshot_version => ?)",
        [str(config.get("table")), str(config.get("schema", "main")), int(snap)],
    ).fetchall()
    return [f for row in rows for f in row if f]


_META = "__ducklake_metadata_lake"  # DuckLake's own tables, for the lake attached as ``lake``
_LIVE = "begin_snapshot <= $snap AND (end_snapshot IS NULL OR end_snapshot > $snap)"


def _table_id(con: Any, config: Mapping[str, Any], snap: int) -> int | None:
    row = con.execute(
        f"SELECT t.table_id FROM {_META}.ducklake_table t JOIN {_META}.ducklake_schema s "
        "ON s.schema_id = t.schema_id WHERE s.schema_name = $schema AND t.table_name = $table "
        "AND s.begin_snapshot <= $snap AND (s.end_snapshot IS NULL OR s.end_snapshot > $snap) "
        "AND t.begin_snapshot <= $snap AND (t.end_snapshot IS NULL OR t.end_snapshot > $snap)",
        {"snap": snap, "schema": str(config.get("schema", "main")),
         "table": str(config.get("table"))},
    ).fetchone()  # fmt: skip
    return None if row is None else int(row[0])


def _why_not_in_place(con: Any, table_id: int, snap: int) -> str | None:
    """Why the table's data files at ``snap`` are not exactly its rows, or None."""
    # The snapshots' changes as DuckLake records them (``inlined_insert:<table id>`` among
    # comma-separated entries), not ``lake.snapshots()``: that function cost ~20 ms of a
    # layout's ~50. A table name holding such an entry reads as inlined: sliced, still right.
    (inlined,) = con.execute(
        f"SELECT count(*) FROM {_META}.ducklake_snapshot_changes WHERE snapshot_id <= $snap "
        "AND list_has_any(string_split(changes_made, ','), "
        "['inlined_insert:' || $t, 'inlined_delete:' || $t])",
        {"t": str(table_id), "snap": snap},
    ).fetchone()
    if inlined:
        return "rows or deletes were inlined in the metadata"
    partitioned = con.execute(
        f"SELECT count(*) FROM {_META}.ducklake_partition_info WHERE table_id = $t AND {_LIVE}",
        {"t": table_id, "snap": snap},
    ).fetchone()[0]
    if partitioned:
        return "partitioned"
    defaults = con.execute(
        f"SELECT count(*) FROM {_META}.ducklake_column WHERE table_id = $t AND {_LIVE} "
        "AND initial_default IS NOT NULL",
        {"t": table_id, "snap": snap},
    ).fetchone()[0]
    return "a column has a default older files read as" if defaults else None


def _column_ids(con: Any, table_id: int, snap: int) -> tuple[dict[str, int], frozenset[int]]:
    """Top-level column name -> DuckLake column id (the files' field id) at ``snap``, and
    every column id the table ever had."""
    live = con.execute(
        f"SELECT column_name, column_id FROM {_META}.ducklake_column WHERE table_id = $t "
        f"AND parent_column IS NULL AND {_LIVE}",
        {"t": table_id, "snap": snap},
    ).fetchall()
    ever = con.execute(
        f"SELECT DISTINCT column_id FROM {_META}.ducklake_column WHERE table_id = ?", [table_id]
    ).fetchall()
    return {str(n): int(i) for n, i in live}, frozenset(int(i) for (i,) in ever)


def _rows(con: Any, at: str, table_id: int, snap: int) -> int:
    """The table's row count at ``snap`` (no inlined rows nor deletes: ``_layout``). From
    its data files' counts in the metadata (~2 ms) unless a file holds rows of later
    snapshots too (``partial_max``): then DuckLake counts them (~45 ms, a scan of the
    snapshot)."""
    total, partial = con.execute(
        f"SELECT sum(record_count), count(partial_max) FROM {_META}.ducklake_data_file "
        f"WHERE table_id = $t AND {_LIVE}",
        {"t": table_id, "snap": snap},
    ).fetchone()
    if partial:
        (total,) = con.execute(f"SELECT count(*) FROM {at}").fetchone()
    return int(total or 0)


def _layout(con: Any, request: ScanRequest, snap: int) -> FileLayout | None:
    config = request.source.config
    table_id = _table_id(con, config, snap)
    if table_id is None or _why_not_in_place(con, table_id, snap) is not None:
        return None
    listed = con.execute(
        "SELECT data_file, data_file_size_bytes, delete_file FROM ducklake_list_files('lake', "
        "?, schema => ?, snapshot_version => ?) ORDER BY data_file",
        [str(config.get("table")), str(config.get("schema", "main")), snap],
    ).fetchall()
    if any(delete for _, _, delete in listed):
        return None  # deletes as delete files: made a slice of instead
    paths = [str(p) for p, _, _ in listed]
    request.check_files("data file", paths)
    counts: dict[str, int] = {}
    if paths:
        counts = dict(
            con.execute(
                "SELECT file_name, num_rows FROM parquet_file_metadata(?::VARCHAR[])", [paths]
            ).fetchall()
        )
    at = f"{table_ref(config)} AT (VERSION => {int(snap)})"
    if sum(counts.values()) != _rows(con, at, table_id, snap):
        return None  # rows the files do not hold, or hold and are gone
    schema = con.execute(f"SELECT * FROM {at} LIMIT 0").arrow().schema
    mapping = physical_names(request.columns, schema.names)
    ids, ever = _column_ids(con, table_id, snap)
    files = tuple(LaidFile(as_uri(p), int(size), int(counts[p])) for p, size, _ in listed)
    return FileLayout(
        files,
        {c: (p, schema.field(p).type) for c, p in mapping.items()},
        field_ids={c: ids[p] for c, p in mapping.items() if p in ids},
        file_ids=ever,
        other_names=frozenset(set(schema.names) - set(mapping.values())),
    )


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
        files' field ids); None when the files are not exactly its rows (``_layout``)."""
        src = request.source
        snap = _snapshot(src.name, src.state)
        if snap is None:
            return FileLayout((), {})
        self.parse_config(src)
        con = connect(src.config)
        try:
            return _layout(con, request, snap)
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
