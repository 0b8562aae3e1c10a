"""``postgres`` sources: a system-versioned PostgreSQL table read as of ``state.as_of``.

Rows visible at ``as_of`` are those of the current table and its history table whose
``sys_period`` contains ``as_of`` (see ``planners.postgres_versioning``). Projection and the
whole predicate go into the SQL (quoted identifiers, bound ``$n`` parameters); the ADBC
PostgreSQL driver streams the result as Arrow (binary COPY, no per-row Python objects).

Config: ``dsn`` (use ``${ENV}`` for passwords), ``table``, optional ``schema`` (``public``) and
``history_table`` (``<table>_history``). State: ``{"as_of": RFC 3339 timestamp}``; a source
without ``as_of`` has no visible rows yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from flight_gateway.errors import InvalidArgument, NotFound, Unavailable
from planners.base import (
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

SYSTEM_COLUMNS = ("sys_period",)


def table_names(config: Mapping[str, Any]) -> tuple[str, str, str]:
    """(schema, table, history table) as given in the config (unquoted)."""
    table = config.get("table")
    if not isinstance(table, str) or not table:
        raise InvalidArgument("postgres source config needs 'table'")
    schema = str(config.get("schema", "public"))
    return schema, table, str(config.get("history_table", f"{table}_history"))


def _dsn(config: Mapping[str, Any]) -> str:
    dsn = config.get("dsn")
    if not isinstance(dsn, str) or not dsn:
        raise InvalidArgument("postgres source config needs 'dsn'")
    return dsn


def connect_adbc(config: Mapping[str, Any]) -> Any:
    import adbc_driver_postgresql.dbapi as adbc

    try:
        return adbc.connect(_dsn(config))
    except Exception as e:
        raise Unavailable(f"cannot connect to PostgreSQL: {e}") from e


class PostgresPlanner:
    def plan(self, request: ScanRequest) -> list[ScanTask]:
        src = request.source
        table_names(src.config)
        if not src.state.get("as_of"):
            return []
        return [ScanTask(src.name, src.kind, {}, exact_filter=True)]

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        src = request.source
        cols = request.columns
        as_of = src.state.get("as_of")
        if not as_of:
            return pa.RecordBatchReader.from_batches(target_schema(cols), iter(()))
        schema, table, history = table_names(src.config)
        con = connect_adbc(src.config)
        try:
            cur = con.cursor()
            cur.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position",
                parameters=(schema, table),
            )
            available = [r[0] for r in cur.fetchall() if r[0] not in SYSTEM_COLUMNS]
            if not available:
                raise NotFound(f"source {src.name!r}: table {schema}.{table} does not exist")
            mapping = physical_names(cols, available)
            pred = pushdown(request, mapping)
            select = (
                ", ".join(quote_ident(c) for c in sorted(set(mapping.values()))) or "NULL AS _none"
            )
            period = "sys_period @> $1::timestamptz"
            sql = (
                f"SELECT {select} FROM {quote_ident(schema)}.{quote_ident(table)} WHERE {period} "
                f"UNION ALL SELECT {select} FROM {quote_ident(schema)}.{quote_ident(history)} "
                f"WHERE {period}"
            )
            params: list[Any] = [str(as_of)]
            if pred is not None:
                where, more = to_sql(pred, "$", first_param=2)
                sql = f"SELECT * FROM ({sql}) AS v WHERE {where}"
                params += more
            if request.limit is not None and (request.predicate is None or pred is not None):
                sql += f" LIMIT {int(request.limit)}"
            cur.execute(sql, parameters=tuple(params))
            reader = cur.fetch_record_batch()
        except Exception as e:
            con.close()
            if isinstance(e, (InvalidArgument, NotFound, Unavailable)):
                raise
            raise Unavailable(f"source {src.name!r}: PostgreSQL read failed: {e}") from e
        out = conform(closing(reader, cur, con), cols, mapping)
        if request.predicate is not None and pred is None:
            out = apply_residual(out, request.predicate)
        return out
