"""System versioning for PostgreSQL tables: ``sys_period``, a history table and a trigger.

Plain plpgsql, no extension. After ``enable_versioning``:
- every row has ``sys_period tstzrange``: ``[time of the writing transaction, NULL)``;
- UPDATE and DELETE copy the old row to ``<table>_history`` with its period closed at the
  writing transaction's time;
- the rows visible at instant T are ``current UNION ALL history`` where ``sys_period @> T``.

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
from typing import Any

from planners.predicates import quote_ident

_FUNCTION = """
CREATE OR REPLACE FUNCTION {schema}.harness_versioning() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND lower(OLD.sys_period) < now() THEN
        -- The old version was valid until this transaction; a row changed twice in one
        -- transaction leaves no (empty) history entry.
        OLD.sys_period := tstzrange(lower(OLD.sys_period), now(), '[)');
        EXECUTE format('INSERT INTO %s SELECT ($1).*', TG_ARGV[0]) USING OLD;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    NEW.sys_period := tstzrange(now(), NULL, '[)');
    RETURN NEW;
END
$fn$;
"""


def enable_versioning(
    conn: Any, table: str, schema: str = "public", history: str | None = None
) -> None:
    """Make ``schema.table`` system-versioned (idempotent). ``conn`` is a psycopg connection."""
    history = history or f"{table}_history"
    s, t, h = quote_ident(schema), quote_ident(table), quote_ident(history)
    with conn.transaction():
        conn.execute(
            f"ALTER TABLE {s}.{t} ADD COLUMN IF NOT EXISTS sys_period tstzrange NOT NULL "
            "DEFAULT tstzrange(now(), NULL, '[)')"
        )
        conn.execute(f"CREATE TABLE IF NOT EXISTS {s}.{h} (LIKE {s}.{t})")
        conn.execute(
            f"CREATE INDEX IF NOT EXISTS {quote_ident(history + '_period')} ON {s}.{h} USING gist (sys_period)"
        )
        conn.execute(_FUNCTION.format(schema=s))
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


def add_commands(subparsers: Any) -> None:
    """``harness-gateway postgres enable-versioning DSN TABLE [--schema S]``."""
    pg = subparsers.add_parser("postgres", help="PostgreSQL source helpers")
    pg_sub = pg.add_subparsers(dest="pg_command", required=True)
    ev = pg_sub.add_parser(
        "enable-versioning", help="add sys_period, a history table and a trigger"
    )
    ev.add_argument("dsn")
    ev.add_argument("table")
    ev.add_argument("--schema", default="public")
    ev.set_defaults(func=_enable_command)


def _enable_command(args: Any) -> int:
    import logging

    import psycopg

    with psycopg.connect(args.dsn) as conn:
        enable_versioning(conn, args.table, schema=args.schema)
    logging.getLogger(__name__).info(
        "%s.%s is system-versioned (history: %s_history)", args.schema, args.table, args.table
    )
    return 0
