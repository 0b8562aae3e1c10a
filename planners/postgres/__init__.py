"""``postgres`` sources: a system-versioned PostgreSQL table read as of ``state.as_of``.

Rows visible at ``as_of`` are those of the current table and its history table whose
``sys_period`` contains ``as_of`` (see ``planners.postgres.versioning``). Projection and the
whole predicate go into the SQL (quoted identifiers, bound ``$n`` parameters); the ADBC
PostgreSQL driver streams the result as Arrow (binary COPY, no per-row Python objects).

Config: ``dsn`` (use ``${ENV}`` for passwords), ``table``, optional ``schema`` (``public``),
``history_table`` (``<table>_history``) and ``tasks`` (4): a table with a primary key is read as
up to that many tasks, ranges of its key (``planners.postgres.split``). State:
``{"as_of": RFC 3339 timestamp}``; a source
without ``as_of`` has no visible rows yet.

Writes: DoPut COPYs the rows and records the commit id in ``harness_doput_log`` in the same
transaction, then takes the next ``as_of`` from the server clock. Schema changes: ``ALTER TABLE``
on the current and the history table. Streaming: the row versions written between two
``as_of`` values (inserts and updates; deletes add no rows).
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from flight_gateway.protocol.errors import InvalidArgument, NotFound, Unavailable
from planners import locations
from planners.common import (
    apply_residual,
    conform,
    empty_reader,
    physical_names,
    pushdown,
)
from planners.kind import (
    Additive,
    AppendContext,
    ColumnSpec,
    Pinned,
    PostgresScan,
    Reach,
    ScanRequest,
    ScanTask,
    SourceConfig,
    SourceKind,
    SourceRef,
)
from planners.postgres import numeric
from planners.postgres.cache import CACHE, cache_key, instant, kept
from planners.postgres.databases import DATABASES, unknown_types
from planners.postgres.pool import ADBC, Renewed
from planners.postgres.split import check_type, key_ranges
from planners.predicates import quote_ident, to_sql
from planners.predicates.sql import postgres_literal

log = logging.getLogger(__name__)
T = TypeVar("T")
_OWN = (InvalidArgument, NotFound, Unavailable)
SYSTEM_COLUMNS = ("sys_period",)


@dataclass(frozen=True, kw_only=True)
class PostgresConfig(SourceConfig):
    dsn: str
    table: str
    schema: str = "public"
    history_table: str | None = None
    #: At most this many tasks (connections) read one pinned version; how many from the size.
    tasks: int = 4

    @property
    def history(self) -> str:
        return self.history_table or f"{self.table}_history"

    def qualified(self, table: str | None = None) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(table or self.table)}"


# libpq parameters that read local files (credentials) or other connection definitions.
_DSN_PATHS = ("passfile", "sslcert", "sslkey", "sslrootcert", "sslcrl", "sslcrldir")
_DSN_REFUSED = ("service", "servicefile")


def dsn_reaches(dsn: str, key: str) -> list[Reach]:
    """What a libpq DSN (key/value or URI form) makes libpq touch: for each host of a multi-host
    DSN the address it connects to — ``hostaddr`` when given (libpq connects there and uses
    ``host`` only to verify certificates and find passwords), else ``host`` — and ``host`` too,
    each with its port; socket directories; and local files read as credentials."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(dsn)
    except Exception as e:
        raise InvalidArgument(f"config {key!r} is not a PostgreSQL connection string") from e
    refused = sorted(set(params) & set(_DSN_REFUSED))
    if refused:
        raise InvalidArgument(f"config {key!r}: libpq parameters {refused} are not allowed")
    out: list[Reach] = []
    for name in ("host", "hostaddr"):
        out += _libpq_hosts(key, name, params)
    if not out:  # libpq's defaults: PGHOST/PGHOSTADDR, else the local server
        env = {k: os.environ[v] for k, v in _ENV.items() if os.environ.get(v)}
        out = [r for n in ("host", "hostaddr") for r in _libpq_hosts(key, n, {**env, **params})]
        out = out or [locations.host(key, f"localhost:{params.get('port') or 5432}")]
    out += [Reach("path", f"{key}.{p}", locations.local_real(str(params[p])))
            for p in _DSN_PATHS if params.get(p)]  # fmt: skip
    return out


_ENV = {"host": "PGHOST", "hostaddr": "PGHOSTADDR", "port": "PGPORT"}


def _libpq_hosts(key: str, name: str, params: Mapping[str, Any]) -> list[Reach]:
    if not params.get(name):
        return []
    hosts = str(params[name]).split(",")
    ports = str(params.get("port") or "5432").split(",")
    out = []
    for i, h in enumerate(hosts):
        port = (ports[i] if i < len(ports) else ports[-1]).strip() or "5432"
        if h.startswith("/"):  # a Unix socket directory
            out.append(Reach("host", f"{key}.{name}", locations.local_real(h)))
        elif h.strip():
            out.append(Reach("host", f"{key}.{name}", locations.host_port(h, port)))
    return out


def table_names(config: Mapping[str, Any]) -> tuple[str, str, str]:
    """(schema, table, history table) of a resolved config (unquoted)."""
    cfg = PostgresConfig.parse(config, where="postgres source")
    return cfg.schema, cfg.table, cfg.history


def _returning(reader: pa.RecordBatchReader, cur: Any, con: Any, dsn: str) -> pa.RecordBatchReader:
    """``reader`` whose connection goes back to the pool when the stream ends normally, and is
    closed when it ends otherwise (closed early, mid-COPY, or failed)."""

    def gen() -> Any:
        done = False
        try:
            yield from reader
            done = True
        finally:
            try:
                cur.close()
            except Exception:
                done = False
            if done:
                ADBC.give(dsn, con)
            else:
                ADBC.discard(dsn, con)

    return pa.RecordBatchReader.from_batches(reader.schema, gen())


def _fetched(cur: Any, dsn: str) -> pa.RecordBatchReader:
    """The result of ``cur``'s query, streamed. A column of a type the connection's driver
    database did not know (made after it) renews that database, and the read runs again on
    a connection of the new one (``pool.Renewed``) before anything was read."""
    reader = cur.fetch_record_batch()
    unknown = unknown_types(reader.schema)
    if unknown and DATABASES.renew(dsn, cur.connection, unknown):
        reader.close()
        raise Renewed("the server's types changed while it was read")
    return reader


def _as_of(name: str, state: Mapping[str, Any]) -> str | None:
    as_of = state.get("as_of")
    if as_of is not None and (not isinstance(as_of, str) or not as_of):
        raise InvalidArgument(f"source {name!r}: as_of must be an RFC 3339 string, got {as_of!r}")
    return as_of or None


# The columns information_schema.columns shows (same visibility rule, same order), read from
# pg_catalog: the ADBC driver plans each query twice (describe, then COPY), and planning the
# information_schema view took 3.6 ms of a 10 ms small read (pg_catalog: 0.5 ms). Reads care
# whether a type is numeric and its precision, and whether the driver decodes it (``_travel``):
# numeric (or a domain over it) is written as information_schema writes it; a domain as its
# base type (the driver sees the base type); arrays as ARRAY and types outside pg_catalog as
# USER-DEFINED, so that neither numeric(5,1)[] nor a type named numeric_x looks numeric.
# A numeric whose column in the history table ($2) is typed otherwise is bare numeric: the
# union of both tables has no declared precision then, and its values may have more decimals
# (``_output`` reads numeric of a declared precision as unscaled integers).
_COLUMNS_SQL = """
SELECT a.attname,
       CASE WHEN coalesce(nullif(t.typbasetype, 0), a.atttypid) = 'numeric'::regtype
            THEN CASE WHEN (h.atttypid, h.atttypmod) IS DISTINCT FROM (a.atttypid, a.atttypmod)
                           AND h.atttypid IS NOT NULL THEN 'numeric'
                      ELSE format_type('numeric'::regtype,
                             CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END) END
            WHEN b.typcategory = 'A' THEN 'ARRAY'
            WHEN b.typnamespace <> 'pg_catalog'::regnamespace THEN 'USER-DEFINED'
            ELSE format_type(b.oid,
                             CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END) END,
       a.attrelid::bigint, pg_relation_filenode(a.attrelid)::bigint
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_type b ON b.oid = coalesce(nullif(t.typbasetype, 0), t.oid)
LEFT JOIN pg_attribute h
       ON h.attrelid = to_regclass($2) AND h.attname = a.attname AND NOT h.attisdropped
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
  AND c.relkind IN ('r', 'v', 'f', 'm', 'p')
  AND (pg_has_role(c.relowner, 'USAGE')
       OR has_column_privilege(c.oid, a.attnum, 'SELECT, INSERT, UPDATE, REFERENCES'))
ORDER BY a.attnum
"""


def _columns(cur: Any, config: PostgresConfig, source: str) -> dict[str, str]:
    """Column name -> data type of the table (system columns left out). Only whether a type
    is numeric, and its precision, matter to the reads (``_output``, ``_engine_output``)."""
    return _columns_and_storage(cur, config, source)[0]


def _columns_and_storage(
    cur: Any, config: PostgresConfig, source: str
) -> tuple[dict[str, str], tuple[int, int]]:
    """``_columns``, and the table's (oid, file node): a table dropped and created again under
    its name has another oid, and one truncated another file node. Neither leaves history,
    so the pinned rows kept of the table before (``planners.postgres.cache``) are not its."""
    cur.execute(_COLUMNS_SQL, parameters=(config.qualified(), config.qualified(config.history)))
    rows = cur.fetchall()
    available = {r[0]: r[1] for r in rows if r[0] not in SYSTEM_COLUMNS}
    if not available:
        raise NotFound(f"source {source!r}: table {config.schema}.{config.table} does not exist")
    return available, (int(rows[0][2]), int(rows[0][3] or 0))


@dataclass(frozen=True)
class _Facts:
    types: dict[str, str]  # column -> data type
    rows: int | None  # the planner's row estimate of current + history (None: never analysed)


class _FactsCache:
    """Column types and row estimates of recently planned tables, so planning a statement needs
    no connection of its own. An entry lives ``ttl_s`` and is looked up again at once when a
    requested column has none of its names in it (a column added since)."""

    def __init__(self, ttl_s: float = 30.0) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[tuple[str, str, str], tuple[float, _Facts]] = {}
        self._lock = threading.Lock()

    def get(self, config: PostgresConfig, columns: Sequence[ColumnSpec]) -> _Facts | None:
        with self._lock:
            hit = self._entries.get((config.dsn, config.schema, config.table))
        if hit is None or time.monotonic() - hit[0] > self.ttl_s:
            return None
        types = hit[1].types
        if any(not any(n in types for n in c.names) for c in columns if c.name != "_source"):
            return None
        return hit[1]

    def put(self, config: PostgresConfig, facts: _Facts) -> None:
        with self._lock:
            if len(self._entries) > 4096:
                self._entries.clear()
            self._entries[(config.dsn, config.schema, config.table)] = (time.monotonic(), facts)


def _facts(config: PostgresConfig, source: str) -> _Facts:
    facts, cur, con = _on_pooled(config, source, lambda cur: _facts_on(cur, config, source))
    cur.close()
    ADBC.give(config.dsn, con)
    return facts


def _facts_on(cur: Any, config: PostgresConfig, source: str) -> _Facts:
    types = _columns(cur, config, source)
    # reltuples is -1 until a table is first analysed: unknown for the current table means
    # no estimate; a history table nobody analysed yet is usually empty or small.
    cur.execute(
        "SELECT (SELECT reltuples FROM pg_class WHERE oid = to_regclass($1)), "
        "(SELECT greatest(reltuples, relpages * 50) FROM pg_class "
        "WHERE oid = to_regclass($2))",
        parameters=(config.qualified(), config.qualified(config.history)),
    )
    current, history = cur.fetchone()
    rows = None if current is None or current < 0 else int(current + max(history or 0, 0))
    return _Facts(types, rows)


def _on_pooled(config: PostgresConfig, source: str, work: Callable[[Any], T]) -> tuple[T, Any, Any]:
    """(``work(cursor)``, the cursor, its connection) on a pooled connection (``pool.ADBC``),
    for the caller to give back when done with them. Failures are Unavailable, except
    ``work``'s own InvalidArgument, NotFound and Unavailable (``_OWN``), raised as they are."""

    def on(con: Any) -> tuple[T, Any]:
        cur = con.cursor()
        return work(cur), cur

    try:
        (out, cur), con = ADBC.attempt(config.dsn, on, own=_OWN)
    except _OWN:
        raise
    except Exception as e:
        raise Unavailable(f"source {source!r}: PostgreSQL read failed: {e}") from e
    return out, cur, con


_FACTS = _FactsCache()


def _versioned(
    config: PostgresConfig,
    mapping: Mapping[str, str],
    types: Mapping[str, str],
    written: str,
    output: Callable[[str, str], str],
) -> str:
    """Row versions of the current and the history table matching ``written`` (SQL over
    ``sys_period``), each column leaving the server as ``output`` says."""
    physical = sorted(set(mapping.values()))
    inner = ", ".join(quote_ident(c) for c in physical) or "NULL AS _none"
    outer = ", ".join(output(c, types[c]) for c in physical) or "NULL AS _none"
    return (
        f"SELECT {outer} FROM (SELECT {inner} FROM {config.qualified()} WHERE {written} "
        f"UNION ALL SELECT {inner} FROM {config.qualified(config.history)} WHERE {written}) AS v"
    )


def _key_range(payload: Mapping[str, Any], bind: Callable[[Any], str]) -> str:
    """The task's key range (``planners.postgres.split``) as SQL, values written by ``bind``."""
    if "key" not in payload:
        return ""
    key, type_ = quote_ident(str(payload["key"])), check_type(str(payload["type"]))
    out = ""
    if payload.get("from") is not None:
        out += f" AND {key} >= CAST({bind(str(payload['from']))} AS {type_})"
    if payload.get("to") is not None:
        out += f" AND {key} < CAST({bind(str(payload['to']))} AS {type_})"
    return out


def _written(request: ScanRequest, task: ScanTask) -> str:
    """Which row versions a task reads, as SQL over ``sys_period``: those written in a
    since-task's interval, or those visible at the pinned ``as_of`` in the task's key range."""
    lit = postgres_literal
    if "until" in task.payload:
        written = f"lower(sys_period) <= {lit(task.payload['until'])}::timestamptz"
        if task.payload.get("written_after"):
            written += f" AND lower(sys_period) > {lit(task.payload['written_after'])}"
            written += "::timestamptz"
        return written
    return f"sys_period @> {lit(request.source.state['as_of'])}::timestamptz" + _key_range(
        task.payload, lit
    )


def _closed_between(cur: Any, config: PostgresConfig, after: str, until: str) -> bool:
    """Whether a row version was closed (updated, deleted) in (``after``, ``until``]."""
    lit = postgres_literal
    # ``&&`` (implied by the bounds that follow) lets the history table's GiST index find the
    # few versions closed since ``after`` instead of scanning every version ever closed.
    cur.execute(
        f"SELECT EXISTS (SELECT 1 FROM {config.qualified(config.history)} "
        f"WHERE sys_period && tstzrange({lit(after)}::timestamptz, NULL, '()') "
        f"AND upper(sys_period) > {lit(after)}::timestamptz "
        f"AND upper(sys_period) <= {lit(until)}::timestamptz)"
    )
    return bool(cur.fetchone()[0])


#: ``_travel``'s type for a column a harness string column reads that the driver does not
#: decode to a value Arrow writes as text faithfully: sent as PostgreSQL's own text.
AS_TEXT = "(as text)"
#: Types (``format_type``'s names, modifiers left out) whose decoded values a harness string
#: column takes as they were (Arrow's cast). The driver sends others as their binary wire
#: form (inet, tsvector, ranges, points: opaque bytes a cast to string passed on as if they
#: were text), or as values whose text is not PostgreSQL's (uuid's bytes, money in cents,
#: intervals, arrays).
_DECODED = frozenset(
    {"text", "character varying", "character", "name", '"char"', "json", "jsonb", "boolean",
     "bpchar", "smallint", "integer", "bigint", "oid", "real", "double precision", "numeric", "date",
     "time without time zone", "timestamp without time zone", "timestamp with time zone",
     "bytea"}
)  # fmt: skip
_MODIFIER = re.compile(r"\(\d+(,\d+)?\)")


def _output(name: str, data_type: str) -> str:
    """How a column leaves the server. NUMERIC of a declared precision up to 18 digits is sent
    as its unscaled 64-bit integer, made a decimal again by ``_decimals`` (``numeric``); other
    NUMERIC as text: Postgres formats it, Arrow parses text to decimal in bulk (both exact),
    which is several times faster than the driver decoding NUMERIC's binary form value by
    value. A column ``_travel`` typed ``AS_TEXT`` as text."""
    q = quote_ident(name)
    if data_type == AS_TEXT:
        return f"v.{q}::text AS {q}"
    declared = numeric.unscaled(data_type)
    if declared is not None:
        return numeric.output(f"v.{q}", q, declared[1])
    return f"v.{q}::text AS {q}" if data_type.startswith("numeric") else f"v.{q}"


def _decimals(
    reader: pa.RecordBatchReader, mapping: Mapping[str, str], types: Mapping[str, str]
) -> pa.RecordBatchReader:
    """``reader`` (a task's query, columns sent as ``_output`` says) with its NUMERIC sent as
    unscaled integers turned back into decimals."""
    declared = {c: numeric.unscaled(types[c]) for c in set(mapping.values())}
    return numeric.decoded(reader, {c: ps for c, ps in declared.items() if ps is not None})


def _travel(
    types: Mapping[str, str], cols: Sequence[ColumnSpec], mapping: Mapping[str, str]
) -> dict[str, str]:
    """``types`` as ``_output`` should see them for a read of ``cols``: a NUMERIC that some
    column other than a decimal reads is written bare, so it travels as text, formatted by
    Postgres (as a decimal, Arrow would write 0.000000005 as a string its own way: 5E-9); a
    column of a type outside ``_DECODED`` that a string column reads is ``AS_TEXT``."""
    read = [(mapping[c.name], c.arrow_type) for c in cols if c.name in mapping]
    other = {p for p, t in read if not pa.types.is_decimal(t)}
    text = {p for p, t in read if pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_string_view(t)}  # fmt: skip
    out = {}
    for c, t in types.items():
        if c in text and _MODIFIER.sub("", t) not in _DECODED:
            out[c] = AS_TEXT
        elif c in other and t.startswith("numeric("):
            out[c] = "numeric"
        else:
            out[c] = t
    return out


def _engine_output(name: str, data_type: str) -> str:
    """How a column leaves the server for DuckDB's postgres extension: NUMERIC of a declared
    precision DuckDB holds exactly (<= 38) in its binary form (decoded natively, about 20%
    faster than text); unconstrained or wider NUMERIC as text (DuckDB would read it as DOUBLE)."""
    q = quote_ident(name)
    if data_type == "numeric" or (
        data_type.startswith("numeric(") and int(data_type[8:].split(",")[0]) > 38
    ):
        return f"v.{q}::text AS {q}"
    return f"v.{q}"


class PostgresKind(SourceKind):
    group_appends = True  # COPY once per commit id; as_of read after it
    config_model = PostgresConfig
    keyed_store = True
    dedupe_tier = 1  # between Kafka (hotter) and the cold formats
    cumulative = False  # movers write and delete rows: streaming compares commit by commit
    warm_imports = ("psycopg", "adbc_driver_postgresql.dbapi")  # ~0.28 s in a fresh process

    def validate_state(self, name: str, state: Mapping[str, Any]) -> None:
        _as_of(name, state)

    def reaches(self, source: SourceRef) -> list[Reach]:
        return dsn_reaches(self.parse_config(source).dsn, "dsn")

    def plan(self, request: ScanRequest) -> list[ScanTask]:
        src = request.source
        self.parse_config(src)
        if not _as_of(src.name, src.state):
            return []
        config: PostgresConfig = self.parse_config(src)
        try:
            split = key_ranges(
                config.dsn,
                config.schema,
                config.table,
                config.history,
                config.tasks,
                where=self._pushed_sql(request, config) if config.tasks > 1 else None,
            )
        except Exception as e:  # one task still reads everything; the read reports failures
            log.info("source %r: read as one task: %s", src.name, type(e).__name__)
            split = None
        if split is None:
            return [ScanTask(src.name, {}, exact_filter=True)]
        column, type_, bounds = split
        edges: list[str | None] = [None, *bounds, None]
        return [
            ScanTask(
                src.name,
                {"key": column, "type": type_, "from": lo, "to": hi},
                exact_filter=True,
            )
            for lo, hi in itertools.pairwise(edges)
        ]

    def _pushed_sql(self, request: ScanRequest, config: PostgresConfig) -> str | None:
        """The read's pushed filter as SQL with inlined literals (None: no filter, or none
        that Postgres evaluates), for estimating how much of the table the read returns."""
        if request.predicate is None:
            return None
        facts = self._facts(config, request)
        pred = pushdown(request, physical_names(request.columns, facts.types))
        if pred is None:
            return None
        try:
            return to_sql(pred, "$", inline=postgres_literal)[0]
        except ValueError:
            return None

    @staticmethod
    def _facts(config: PostgresConfig, request: ScanRequest) -> _Facts:
        facts = _FACTS.get(config, request.columns)
        if facts is None:
            facts = _facts(config, request.source.name)
            _FACTS.put(config, facts)
        return facts

    def plan_added(self, request: ScanRequest, before: Mapping[str, Any] | None) -> list[ScanTask]:
        src = request.source
        until = _as_of(src.name, src.state)
        after = _as_of(src.name, before) if before else None
        if until is None or until == after:
            return []
        return [ScanTask(src.name, {"written_after": after, "until": until}, exact_filter=True)]

    def _select(
        self,
        request: ScanRequest,
        task: ScanTask,
        config: PostgresConfig,
        mapping: dict[str, str],
        types: dict[str, str],
        written: str | None = None,
    ) -> str:
        """The SQL of a task (pinned rows, or the row versions a since-task covers; or the row
        versions ``written`` says, SQL over ``sys_period`` and the task's key range), its values
        written as literals. Why not parameters: the ADBC driver streams a query without them
        through binary COPY, pipelined with the server, but runs one with them as a prepared
        statement whose whole result libpq buffers before the first batch (3x slower on 2 M
        rows, and all of it in memory). The filter applies to the columns as stored; the
        outer select only changes how they travel."""
        try:
            return self._sql(request, task, config, mapping, types, written)
        except ValueError as e:  # the one value with no literal: text holding NUL
            raise InvalidArgument(
                f"source {request.source.name!r}: a filter value cannot be sent to PostgreSQL: {e}"
            ) from e

    def _sql(
        self,
        request: ScanRequest,
        task: ScanTask,
        config: PostgresConfig,
        mapping: dict[str, str],
        types: dict[str, str],
        written: str | None,
    ) -> str:
        lit = postgres_literal
        if written is None:
            written = _written(request, task)
        sql = _versioned(config, mapping, types, written, _output)
        pred = pushdown(request, mapping)
        if pred is not None:
            sql += f" WHERE {to_sql(pred, '$', inline=lit)[0]}"
        if request.limit is not None and (request.predicate is None or pred is not None):
            sql += f" LIMIT {int(request.limit)}"
        return sql

    def engine_scan(self, request: ScanRequest, tasks: Sequence[ScanTask]) -> PostgresScan | None:
        """The pinned rows as one SELECT with the as-of instant inlined (DuckDB's
        ``postgres_query`` takes no parameters); the engine applies the statement's filter."""
        src = request.source
        as_of = _as_of(src.name, src.state)
        if not tasks or as_of is None or any("until" in t.payload for t in tasks):
            return None  # nothing visible, or since-tasks: the harness stream reads them
        config: PostgresConfig = self.parse_config(src)
        facts = self._facts(config, request)
        types = facts.types
        mapping = physical_names(request.columns, types)
        written = f"sys_period @> {postgres_literal(as_of)}::timestamptz"
        query = _versioned(config, mapping, types, written, _engine_output)
        pred = pushdown(request, mapping)
        if pred is not None:
            try:
                where, _ = to_sql(pred, "$", inline=postgres_literal)
                query += f" WHERE {where}"
            except ValueError:
                pass  # a value with no literal form: the engine filters every row itself
        return PostgresScan(config.dsn, query, mapping, facts.rows)

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        src = request.source
        cols = request.columns
        if not _as_of(src.name, src.state) and "until" not in task.payload:
            return empty_reader(cols)
        config: PostgresConfig = self.parse_config(src)
        # Pinned rows go through the cache (``planners.postgres.cache``); since-tasks and
        # limited reads (a part of the rows) do not.
        at = None
        if "until" not in task.payload and request.limit is None:
            at = instant(src.state["as_of"])

        def start(cur: Any) -> tuple[pa.RecordBatchReader | pa.Table, dict[str, str]]:
            types, storage = _columns_and_storage(cur, config, src.name)
            mapping = physical_names(cols, types)
            types = _travel(types, cols, mapping)
            if at is not None:
                shape = (types, mapping, storage)
                return self._pinned(request, task, config, shape, at, cur), mapping
            cur.execute(self._select(request, task, config, mapping, types))
            return _decimals(_fetched(cur, config.dsn), mapping, types), mapping

        (got, mapping), cur, con = _on_pooled(config, src.name, start)
        if isinstance(got, pa.Table):  # nothing left to stream from the server
            cur.close()
            ADBC.give(config.dsn, con)
            reader = pa.RecordBatchReader.from_batches(got.schema, got.to_batches())
        else:
            reader = _returning(got, cur, con, config.dsn)
        out = conform(reader, cols, mapping)
        if request.predicate is not None and pushdown(request, mapping) is None:
            out = apply_residual(out, request.predicate)
        return out

    def _pinned(
        self,
        request: ScanRequest,
        task: ScanTask,
        config: PostgresConfig,
        shape: tuple[dict[str, str], dict[str, str], tuple[int, int]],
        at: dt.datetime,
        cur: Any,
    ) -> pa.Table | pa.RecordBatchReader:
        """The task's rows at the pinned ``as_of`` (``at``): held by the cache, or the cache's
        newest earlier rows and those written since, or all of them from the server (streamed,
        and kept when they fit)."""
        types, mapping, storage = shape
        lit, as_of = postgres_literal, request.source.state["as_of"]
        within = _key_range(task.payload, lit)
        query = self._select(request, task, config, mapping, types, "{as_of}" + within)
        selected = {c: types[c] for c in mapping.values()}
        key = cache_key(config.dsn, config.qualified(), query, selected, storage)
        base = CACHE.before(key, at)
        if base is not None and base.as_of == at:
            CACHE.hits[key] += 1
            return base.rows
        if base is not None and not _closed_between(cur, config, base.at, as_of):
            written = f"lower(sys_period) > {lit(base.at)}::timestamptz AND "
            cur.execute(
                self._select(
                    request, task, config, mapping, types, written + _written(request, task)
                )
            )
            fetched = _fetched(cur, config.dsn)
            since = _decimals(fetched, mapping, types)
            if since.schema.equals(base.rows.schema):
                CACHE.extended[key] += 1
                return kept(since, key, at, as_of, base=base.rows)
            fetched.close()  # typed otherwise than the kept rows: all of them, as below
        CACHE.misses[key] += 1
        cur.execute(self._select(request, task, config, mapping, types))
        return kept(_decimals(_fetched(cur, config.dsn), mapping, types), key, at, as_of)

    # ------------------------------------------------------------------ writing

    def append(self, ctx: AppendContext, rows: pa.Table) -> dict[str, Any]:
        from planners.postgres.writes import copy_rows

        config: PostgresConfig = self.parse_config(ctx.source)
        as_of = copy_rows(config, ctx.source.name, ctx.commit_id, rows, ctx.aliases)
        return {**ctx.source.state, "as_of": as_of}

    def merge(
        self, ctx: AppendContext, upserts: pa.Table, deletes: pa.Table, key: Sequence[str]
    ) -> dict[str, Any]:
        from planners.postgres.writes import merge_rows

        config: PostgresConfig = self.parse_config(ctx.source)
        as_of = merge_rows(
            config, ctx.source.name, ctx.commit_id, upserts, deletes, ctx.aliases, key
        )
        return {**ctx.source.state, "as_of": as_of}

    def drain(
        self,
        ctx: AppendContext,
        moved: Mapping[str, Any],
        rows: pa.Table,
        key: Sequence[str],
        partial: bool,
    ) -> dict[str, Any]:
        """The moved rows leave the table (deleted by key, each only if unchanged since the
        moved ``as_of``); the next ``as_of`` is after the deletion."""
        from planners.postgres.writes import drain_rows

        name = ctx.source.name
        if not key:
            raise InvalidArgument(f"source {name!r}: rows move out of PostgreSQL by primary key")
        as_of = moved.get("as_of")
        if not isinstance(as_of, str):
            raise InvalidArgument(f"source {name!r}: the moved state has no 'as_of'")
        config: PostgresConfig = self.parse_config(ctx.source)
        next_as_of = drain_rows(
            config, name, f"{ctx.commit_id}:drain", rows, as_of, ctx.aliases, key
        )
        return {**ctx.source.state, "as_of": next_as_of}

    def apply_additive(self, source: SourceRef, changes: Sequence[Additive]) -> None:
        from planners.postgres.writes import alter_tables

        alter_tables(self.parse_config(source), changes)

    def maintain(self, pinned: Sequence[Pinned], grace_s: float) -> dict[str, Any]:
        """Replace versioning triggers an older release installed in the pinned sources'
        databases (docs/sources.md); removes nothing."""
        import psycopg

        from planners.postgres.versioning import upgrade_versioning

        upgraded: list[str] = []
        for dsn in sorted({self.parse_config(p.source).dsn for p in pinned}):
            try:
                with psycopg.connect(dsn) as conn:
                    upgraded += upgrade_versioning(conn)
            except psycopg.Error as e:
                raise Unavailable(f"PostgreSQL maintenance failed: {e}") from e
        return {"upgraded": upgraded}

    def add_commands(self, subparsers: Any) -> None:
        from planners.postgres.commands import add_commands

        add_commands(subparsers)


__all__ = ["PostgresConfig", "PostgresKind", "table_names"]
