"""System versioning for PostgreSQL tables: ``sys_period``, a history table and two triggers.

Plain plpgsql, no extension. After ``enable_versioning``:
- every row has ``sys_period tstzrange``: ``[time of the writing transaction, NULL)``;
- UPDATE and DELETE copy the old row to ``<table>_history``, where its period is closed at the
  writing transaction's time;
- the rows visible at instant T are ``current UNION ALL history`` where ``sys_period @> T``.

Why two triggers, and why neither ever assigns to ``OLD`` (docs/sources.md): PostgreSQL 15
crashes the backend (and resets the whole cluster) when a plpgsql trigger assigns to a field of
``OLD`` -- or of a record copied from it -- for a row stored before a column was added with a
fast default (``ADD COLUMN ... DEFAULT``: the row has no stored value for that attribute).
``ADD COLUMN sys_period ... DEFAULT`` itself makes every existing row such a row, and users add
columns the same way later. So the table's trigger only *reads* ``OLD`` (field reads and passing
the row as a parameter are safe) and inserts it unchanged into the history table; the history
table's own ``BEFORE INSERT`` trigger closes the period on ``NEW``, a tuple the INSERT has just
formed with every attribute.

Safe ``as_of`` (why the harness can pin Postgres): a transaction's rows carry its *start* time,
so a transaction that started before T but commits after T would make rows appear at T later.
Writers therefore (1) hold the harness lock on the source while they write, (2) commit their
transaction, (3) read ``clock_timestamp()`` from the server *after* committing, and (4) commit
that as the new ``as_of`` while still holding the lock. Readers only use committed ``as_of``
values, so everything visible at them was committed before them; the next writer starts after
the lock is released, so after this ``as_of``. ``server_now`` gives step (3).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from planners.predicates import quote_ident

log = logging.getLogger(__name__)

#: Written as the functions' comment; older releases installed functions without it.
VERSION_MARK = "dataharness versioning 2"

# Never assign to OLD (module docstring). A row changed twice in one transaction leaves no
# (empty) history entry: its current version started in this transaction.
_FUNCTION = """
CREATE OR REPLACE FUNCTION {schema}.harness_versioning() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND lower(OLD.sys_period) < now() THEN
        -- OLD goes in unchanged; the history table's trigger closes its period.
        EXECUTE format('INSERT INTO %s SELECT ($1).*', TG_ARGV[0]) USING OLD;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    NEW.sys_period := tstzrange(now(), NULL, '[)');
    RETURN NEW;
END
$fn$;
COMMENT ON FUNCTION {schema}.harness_versioning() IS '{mark}';
CREATE OR REPLACE FUNCTION {schema}.harness_versioning_close() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    -- NEW is the row this INSERT formed (every attribute stored): assigning to it is safe.
    IF upper_inf(NEW.sys_period) THEN
        NEW.sys_period := tstzrange(lower(NEW.sys_period), now(), '[)');
    END IF;
    RETURN NEW;
END
$fn$;
COMMENT ON FUNCTION {schema}.harness_versioning_close() IS '{mark}';
"""

# Concurrent enable/upgrade calls (two gateways, a CLI) take turns: replacing the shared
# function and adding the history triggers must be seen together.
_LOCK = "SELECT pg_advisory_xact_lock(hashtext('dataharness.versioning'))"


def _install_functions(conn: Any, schema: str) -> None:
    conn.execute(_FUNCTION.format(schema=quote_ident(schema), mark=VERSION_MARK))


def _close_trigger(conn: Any, schema: str, history: str) -> None:
    """(Re)create the period-closing trigger on a history table (``history``: SQL text of a
    qualified, quoted name)."""
    s = quote_ident(schema)
    conn.execute(f"DROP TRIGGER IF EXISTS harness_versioning_close ON {history}")
    conn.execute(
        f"CREATE TRIGGER harness_versioning_close BEFORE INSERT ON {history} "
        f"FOR EACH ROW EXECUTE FUNCTION {s}.harness_versioning_close()"
    )


def _versioned_tables(conn: Any, schema: str) -> list[tuple[str, str]]:
    """(table, history) of every table whose trigger calls ``schema.harness_versioning``, as
    SQL text of qualified names (the history name as the trigger was given it)."""
    rows = conn.execute(
        "SELECT tg.tgrelid::regclass::text, tg.tgargs FROM pg_trigger tg "
        "JOIN pg_proc p ON p.oid = tg.tgfoid JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE p.proname = 'harness_versioning' AND n.nspname = %s AND NOT tg.tgisinternal",
        (schema,),
    ).fetchall()
    out = []
    for table, args in rows:
        target = bytes(args).split(b"\x00")[0].decode()
        history = conn.execute("SELECT to_regclass(%s)::text", (target,)).fetchone()[0]
        if history is None:
            raise RuntimeError(f"history table {target} of {table} does not exist")
        out.append((table, history))
    return out


def _upgrade_schema(conn: Any, schema: str) -> list[str]:
    """Inside a transaction: install the current functions in ``schema`` and give every history
    table that the shared function feeds its closing trigger, all at once (the new function
    relies on that trigger). Returns the tables upgraded."""
    _install_functions(conn, schema)
    tables = _versioned_tables(conn, schema)
    for _table, history in tables:
        _close_trigger(conn, schema, history)
    return [t for t, _ in tables]


def outdated_schemas(conn: Any) -> list[str]:
    """Schemas holding a ``harness_versioning`` function from an older release."""
    rows = conn.execute(
        "SELECT n.nspname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE p.proname = 'harness_versioning' "
        "AND coalesce(obj_description(p.oid, 'pg_proc'), '') <> %s ORDER BY 1",
        (VERSION_MARK,),
    ).fetchall()
    return [r[0] for r in rows]


def upgrade_versioning(conn: Any) -> list[str]:
    """Replace older releases' versioning functions in every schema of the database, in place
    and atomically per database (idempotent). Returns the tables whose versioning changed.
    ``conn`` is a psycopg connection without an open transaction."""
    upgraded: list[str] = []
    with conn.transaction():
        conn.execute(_LOCK)
        for schema in outdated_schemas(conn):
            upgraded += _upgrade_schema(conn, schema)
    if upgraded:
        log.info("versioning upgraded to %s on %s", VERSION_MARK, ", ".join(upgraded))
    return upgraded


def ensure_current(conn: Any, schema: str) -> None:
    """Upgrade the database's versioning when ``schema`` holds an older release's function,
    before the harness writes through it (one catalog query when it is current)."""
    with conn.transaction():
        stale = schema in outdated_schemas(conn)
    if stale:
        upgrade_versioning(conn)


def enable_versioning(
    conn: Any, table: str, schema: str = "public", history: str | None = None
) -> None:
    """Make ``schema.table`` system-versioned (idempotent; re-running it on a table versioned by
    an older release upgrades the schema's triggers in place). ``conn`` is a psycopg
    connection.

    Existing rows are not rewritten: ``sys_period`` is added with a fast default, which the
    triggers handle (module docstring), and rewriting would hold an exclusive lock on the whole
    table for as long as the rewrite takes.
    """
    history = history or f"{table}_history"
    s, t, h = quote_ident(schema), quote_ident(table), quote_ident(history)
    with conn.transaction():
        conn.execute(_LOCK)
        conn.execute(
            f"ALTER TABLE {s}.{t} ADD COLUMN IF NOT EXISTS sys_period tstzrange NOT NULL "
            "DEFAULT tstzrange(now(), NULL, '[)')"
        )
        conn.execute(f"CREATE TABLE IF NOT EXISTS {s}.{h} (LIKE {s}.{t})")
        conn.execute(
            f"CREATE INDEX IF NOT EXISTS {quote_ident(history + '_period')} ON {s}.{h} USING gist (sys_period)"
        )
        # Rows written since an instant (a read that extends the rows it kept at an earlier
        # as_of, ``planners.postgres.cache``) are found by this index instead of a scan of
        # the whole table per read: 23.7 -> 1.2 ms of the server's time at 250 k rows. BRIN,
        # not a B-tree: rows are appended in the order they are written, and from PostgreSQL
        # 16 a BRIN index does not stop updates being HOT (the trigger rewrites sys_period
        # on every update, and a B-tree over it made every update write every index of the
        # table: 0 of 225 k updates HOT against 185 k; docs/operations.md, 2026-12-05).
        conn.execute(
            f"CREATE INDEX IF NOT EXISTS {quote_ident(table + '_written')} ON {s}.{t} "
            "USING brin (lower(sys_period))"
        )
        _upgrade_schema(conn, schema)
        _close_trigger(conn, schema, f"{s}.{h}")
        conn.execute(f"DROP TRIGGER IF EXISTS harness_versioning ON {s}.{t}")
        # The history table name is passed quoted, as format('%s') expects SQL text.
        target = f"{s}.{h}".replace("'", "''")
        conn.execute(
            f"CREATE TRIGGER harness_versioning BEFORE INSERT OR UPDATE OR DELETE ON {s}.{t} "
            f"FOR EACH ROW EXECUTE FUNCTION {s}.harness_versioning('{target}')"
        )


def server_now(conn: Any) -> str:
    """The Postgres server's clock as RFC 3339 (microseconds): the next ``as_of``.

    Refuses to run inside an open transaction: the writes must be committed first, or rows of
    that transaction would carry a start time earlier than the ``as_of`` yet appear only later.
    Leaves no transaction open behind it (a non-autocommit connection would otherwise turn the
    caller's next ``conn.transaction()`` into a savepoint of an older transaction).
    """
    from psycopg.pq import TransactionStatus

    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise RuntimeError("commit the write transaction before taking the next as_of")
    with conn.transaction():
        value = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    return str(value)
