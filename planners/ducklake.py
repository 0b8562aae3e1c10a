"""``ducklake`` sources: a DuckLake table read ``AT (VERSION => snapshot_id)`` through DuckDB.

Config: ``metadata`` (what follows ``ducklake:`` in ATTACH: a DuckDB file, ``sqlite:path`` or
``postgres:dsn``), ``data_path``, ``table`` and optional ``schema`` (default ``main``).
State: ``{"snapshot_id": int}``. Projection and the whole predicate go into the SQL (quoted
identifiers, bound parameters), so DuckDB filters exactly and streams Arrow batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from flight_gateway.errors import InvalidArgument, Unavailable
from planners.base import (
    DEFAULT_BATCH_ROWS,
    ScanRequest,
    ScanTask,
    closing,
    conform,
    physical_names,
    pushdown,
    target_schema,
)
from planners.predicates import quote_ident, to_sql
from planners.scan import apply_residual


def connect(config: Mapping[str, Any], *, read_only: bool = True) -> Any:
    """A DuckDB connection with the lake attached as ``lake`` (extensions loaded offline)."""
    import duckdb
    import duckdb_extensions

    metadata, data_path = config.get("metadata"), config.get("data_path")
    if not isinstance(metadata, str) or not metadata:
        raise InvalidArgument("ducklake source config needs 'metadata'")
    con = duckdb.connect(
        config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    )
    try:
        duckdb_extensions.import_extension("ducklake", con=con)
        if metadata.startswith("sqlite:"):
            duckdb_extensions.import_extension("sqlite", con=con)
        if metadata.startswith("postgres:"):
            duckdb_extensions.import_extension("postgres", con=con)
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
    return con


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def table_ref(config: Mapping[str, Any]) -> str:
    table = config.get("table")
    if not isinstance(table, str) or not table:
        raise InvalidArgument("ducklake source config needs 'table'")
    return f"lake.{quote_ident(str(config.get('schema', 'main')))}.{quote_ident(table)}"


class DuckLakePlanner:
    def plan(self, request: ScanRequest) -> list[ScanTask]:
        src = request.source
        if src.state.get("snapshot_id") is None:
            return []
        return [ScanTask(src.name, src.kind, {}, exact_filter=True)]

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        src = request.source
        cols = request.columns
        snap = src.state.get("snapshot_id")
        if snap is None:
            return pa.RecordBatchReader.from_batches(target_schema(cols), iter(()))
        con = connect(src.config)
        try:
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
