"""Writing to a system-versioned Postgres table: DoPut's COPY and additive DDL."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from flight_gateway.protocol.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable
from planners.common import to_physical
from planners.kind import Additive
from planners.postgres import PostgresConfig
from planners.postgres.versioning import (
    ensure_current,
    outdated_schemas,
    server_now,
    upgrade_versioning,
)
from planners.predicates import quote_ident
from planners.sqltypes import sql_type

_LOG_DDL = (
    "CREATE TABLE IF NOT EXISTS harness_doput_log (commit_id text, source text, "
    "written_at timestamptz DEFAULT now(), PRIMARY KEY (commit_id, source))"
)


def _ensure_log(conn: Any) -> None:
    """Create the DoPut log once per database. Two first DoPuts at once would otherwise both
    run CREATE TABLE and one would fail on the catalog's unique index."""
    with conn.transaction():
        if conn.execute("SELECT to_regclass('harness_doput_log')").fetchone()[0] is not None:
            return
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('dataharness.doput_log'))")
        conn.execute(_LOG_DDL)


def _existing_columns(conn: Any, config: PostgresConfig) -> list[str]:
    # pg_catalog, not information_schema.columns: the server plans that view's joins on each
    # call (3.6 ms of a small read before reads moved off it).
    return [
        r[0]
        for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s)"
            " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (config.qualified(),),
        )
    ]


#: Databases (DSNs) where this process found the DoPut log: created once per database, so
#: looked for once per process, not per write (a transaction of two statements). One dropped
#: by hand since fails the write's first statement, which forgets it here and runs again.
_LOGGED: set[str] = set()
_logged_lock = threading.Lock()


def _prepare(conn: Any, config: PostgresConfig) -> None:
    # The versioning is checked on every write (one statement): an older release's gateway
    # beside this one (a rolling upgrade) may install its function again at any time.
    if config.schema in outdated_schemas(conn):
        upgrade_versioning(conn)
    if config.dsn not in _LOGGED:
        _ensure_log(conn)
        with _logged_lock:
            _LOGGED.add(config.dsn)


def _missing(e: Exception, config: PostgresConfig, source: str) -> Exception:
    """NOT_FOUND when the relation missing is the source's table (its config names none);
    UNAVAILABLE for another (the history table, a trigger's): the server's set-up, not the
    caller."""
    m = re.search(r'relation "([^"]+)" does not exist', str(e))
    name = m.group(1).rsplit(".", 1)[-1] if m else None
    if name == config.table:
        return NotFound(f"source {source!r}: table {config.qualified()} does not exist")
    return Unavailable(f"source {source!r}: PostgreSQL: {str(e).splitlines()[0]}")


def _refused(e: Exception, source: str) -> Exception:
    """The caller's rows refused by the table (a key already there, a NULL in a NOT NULL
    column, a CHECK, a value out of its type's range): the caller's doing, not the gateway's
    (it was INTERNAL). The server's message, and its detail only where that names a key: for
    CHECK and NOT NULL the detail is "Failing row contains (...)", every column of the row
    (for an upsert, columns the caller never sent), as the CONTEXT is."""
    import psycopg

    diag = getattr(e, "diag", None)
    text = (getattr(diag, "message_primary", None) or type(e).__name__).strip()
    detail = getattr(diag, "message_detail", None)
    keyed = (psycopg.errors.UniqueViolation, psycopg.errors.ForeignKeyViolation)
    if detail and isinstance(e, keyed):
        text += f" ({detail.strip()})"
    if isinstance(e, psycopg.errors.UniqueViolation):
        return AlreadyExists(f"source {source!r}: a row with that key is there already: {text}")
    return InvalidArgument(f"source {source!r}: the table refused the rows: {text}")


def _once(config: PostgresConfig, source: str, commit_id: str, write: Callable[[Any], None]) -> str:
    """Run ``write(conn)`` and log ``commit_id`` in one transaction unless the log has it
    already (a retry writes nothing), then return the server clock as the next ``as_of`` (the
    caller holds the source's lock, as the ``as_of`` protocol requires). The connection is a
    pooled one (``PLANNING``): opening one per write (a server process forked, TCP and
    authentication) was a quarter of a Postgres DoPut's lease under load. A pooled connection
    the server dropped fails its work, which runs again on a fresh one: the log makes that
    safe, as for any retry."""
    import psycopg

    from planners.postgres.pool import PLANNING

    # The log is the database's, shared by every harness table writing into it: an entry names
    # the table written, so one table's commit id never stands for another's write (two tables
    # of one catalog, or of two catalogs, may well use the same commit ids and source names).
    entry = f"{config.qualified()}:{commit_id}"

    def work(conn: Any) -> str:
        _prepare(conn, config)
        with conn.transaction():
            try:
                done = conn.execute(
                    "SELECT 1 FROM harness_doput_log WHERE commit_id = %s AND source = %s",
                    (entry, source),
                ).fetchone()
            except psycopg.errors.UndefinedTable:
                with _logged_lock:
                    _LOGGED.discard(config.dsn)  # the retry on a fresh connection makes it
                raise
            if done is None:
                try:
                    write(conn)
                except psycopg.errors.UndefinedTable as e:
                    raise _missing(e, config, source) from None
                except (psycopg.errors.IntegrityError, psycopg.errors.DataError) as e:
                    raise _refused(e, source) from None
                conn.execute(
                    "INSERT INTO harness_doput_log (commit_id, source) VALUES (%s, %s)",
                    (entry, source),
                )
        return server_now(conn)  # after the rows committed

    try:
        return PLANNING.run(
            config.dsn, work, own=(InvalidArgument, NotFound, AlreadyExists, Unavailable)
        )
    except psycopg.OperationalError as e:  # the server, not the caller: UNAVAILABLE, retried
        raise Unavailable(f"source {source!r}: PostgreSQL unavailable: {e}") from None


def copy_rows(
    config: PostgresConfig,
    source: str,
    commit_id: str,
    rows: pa.Table,
    aliases: Mapping[str, tuple[str, ...]],
) -> str:
    """COPY ``rows`` once per commit id (``_once``); returns the next ``as_of``."""

    def write(conn: Any) -> None:
        _copy(conn, config.qualified(), to_physical(rows, _existing_columns(conn, config), aliases))

    return _once(config, source, commit_id, write)


def _csv_ready(t: pa.DataType) -> bool:
    """Types whose text pyarrow's CSV writer prints as Postgres parses it."""
    return (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_decimal(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
    )


def _copy(conn: Any, target: str, data: pa.Table) -> None:
    """COPY ``data`` into ``target``: as CSV text pyarrow writes in C++ (a string is always
    quoted, so "" is an empty string and an unquoted empty field is NULL), row by row through
    psycopg for types CSV cannot carry (lists, structs, binary, times)."""
    import io

    import pyarrow.csv as pacsv

    cols = ", ".join(quote_ident(c) for c in data.column_names)
    if all(_csv_ready(f.type) for f in data.schema):
        options = pacsv.WriteOptions(include_header=False, quoting_style="needed")
        with conn.cursor().copy(f"COPY {target} ({cols}) FROM STDIN (FORMAT csv)") as copy:
            for batch in data.to_batches(max_chunksize=65_536):
                buf = io.BytesIO()
                pacsv.write_csv(batch, buf, options)
                copy.write(buf.getvalue())
        return
    with conn.cursor().copy(f"COPY {target} ({cols}) FROM STDIN") as copy:
        for row in data.to_pylist():
            copy.write_row(tuple(row.values()))


def _staged(conn: Any, config: PostgresConfig, name: str, data: pa.Table) -> str:
    """``data`` COPYed into a temporary table shaped like the target's columns."""
    cols = ", ".join(quote_ident(c) for c in data.column_names)
    conn.execute(
        f"CREATE TEMP TABLE {name} ON COMMIT DROP AS "
        f"SELECT {cols} FROM {config.qualified()} WITH NO DATA"
    )
    _copy(conn, name, data)
    return name


def merge_rows(
    config: PostgresConfig,
    source: str,
    commit_id: str,
    upserts: pa.Table,
    deletes: pa.Table,
    aliases: Mapping[str, tuple[str, ...]],
    key: Sequence[str],
) -> str:
    """Upsert (``INSERT ... ON CONFLICT (key) DO UPDATE``) and delete by key once per commit id
    (``_once``), through staged temporary tables; the versioning triggers keep the replaced and
    deleted rows in history. The table needs a primary key or unique constraint on ``key``.
    Returns the next ``as_of``."""

    def write(conn: Any) -> None:
        existing = _existing_columns(conn, config)
        phys_key = to_physical(pa.table({k: [] for k in key}), existing, aliases).column_names
        if deletes.num_rows:
            gone = _staged(conn, config, "harness_deletes", to_physical(deletes, existing, aliases))
            match = " AND ".join(f"t.{quote_ident(k)} = d.{quote_ident(k)}" for k in phys_key)
            conn.execute(f"DELETE FROM {config.qualified()} t USING {gone} d WHERE {match}")
        if upserts.num_rows:
            _upsert(conn, config, source, to_physical(upserts, existing, aliases), phys_key)

    return _once(config, source, commit_id, write)


def drain_rows(
    config: PostgresConfig,
    source: str,
    commit_id: str,
    moved: pa.Table,
    as_of: str,
    aliases: Mapping[str, tuple[str, ...]],
    key: Sequence[str],
) -> str:
    """Delete the moved rows (their ``key`` columns in ``moved``) once per commit id, each only
    if its row is still the one visible at ``as_of`` (``lower(sys_period) <= as_of``: a row
    written since is newer than what was moved, and stays); the versioning triggers keep the
    deleted rows in history, so the versions that pinned them still read them. Returns the next
    ``as_of``."""

    def write(conn: Any) -> None:
        if not moved.num_rows:
            return
        existing = _existing_columns(conn, config)
        gone = _staged(
            conn, config, "harness_drained", to_physical(moved.select(list(key)), existing, aliases)
        )
        phys_key = to_physical(pa.table({k: [] for k in key}), existing, aliases).column_names
        match = " AND ".join(f"t.{quote_ident(k)} = d.{quote_ident(k)}" for k in phys_key)
        conn.execute(
            f"DELETE FROM {config.qualified()} t USING {gone} d WHERE {match} "
            "AND lower(t.sys_period) <= %s::timestamptz",
            (as_of,),
        )

    return _once(config, source, commit_id, write)


def _upsert(
    conn: Any, config: PostgresConfig, source: str, data: pa.Table, key: Sequence[str]
) -> None:
    import psycopg

    new = _staged(conn, config, "harness_upserts", data)
    cols = ", ".join(quote_ident(c) for c in data.column_names)
    keys = ", ".join(quote_ident(k) for k in key)
    update = ", ".join(
        f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in data.column_names if c not in key
    )
    action = f"DO UPDATE SET {update}" if update else "DO NOTHING"
    try:
        conn.execute(
            f"INSERT INTO {config.qualified()} ({cols}) SELECT {cols} FROM {new} "
            f"ON CONFLICT ({keys}) {action}"
        )
    except psycopg.errors.InvalidColumnReference as e:
        raise InvalidArgument(
            f"source {source!r}: upserts need a primary key or unique constraint on ({keys}) "
            f"in {config.qualified()}"
        ) from e


def alter_tables(config: PostgresConfig, changes: Sequence[Additive]) -> None:
    """Additive DDL on the current and the history table (idempotent statements)."""
    import psycopg

    with psycopg.connect(config.dsn) as conn:
        ensure_current(conn, config.schema)
        _alter(conn, config, changes)


def _alter(conn: Any, config: PostgresConfig, changes: Sequence[Additive]) -> None:
    with conn.transaction():
        existing = set(_existing_columns(conn, config))
        for t in (config.table, config.history):
            target = config.qualified(t)
            for c in changes:
                col_type = sql_type(c.type, postgres=True)
                if c.op == "add":
                    conn.execute(
                        f"ALTER TABLE {target} ADD COLUMN IF NOT EXISTS "
                        f"{quote_ident(c.names[0])} {col_type}"
                    )
                    continue
                phys = next((n for n in c.names if n in existing), None)
                if phys is not None:
                    conn.execute(
                        f"ALTER TABLE {target} ALTER COLUMN {quote_ident(phys)} TYPE {col_type}"
                    )
