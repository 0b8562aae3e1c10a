"""The kind's ``harness-gateway`` sub-commands: ``postgres enable-versioning DSN TABLE
[--schema S]`` and ``postgres upgrade-versioning DSN``.

This module is the commands' face, kept apart from ``versioning`` (library code, which only
logs): each command prints one line on stdout saying what it did, as the other commands do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flight_gateway.protocol.errors import InvalidArgument, Unavailable
from planners.postgres.versioning import VERSION_MARK, enable_versioning, upgrade_versioning


def add_commands(subparsers: Any) -> None:
    pg = subparsers.add_parser("postgres", help="PostgreSQL source helpers")
    pg_sub = pg.add_subparsers(dest="pg_command", required=True)
    ev = pg_sub.add_parser(
        "enable-versioning", help="add sys_period, a history table and the triggers"
    )
    ev.add_argument("dsn")
    ev.add_argument("table")
    ev.add_argument("--schema", default="public")
    ev.set_defaults(func=_enable_command)
    up = pg_sub.add_parser(
        "upgrade-versioning",
        help="replace versioning functions installed by older releases (every schema)",
    )
    up.add_argument("dsn")
    up.set_defaults(func=_upgrade_command)


@contextmanager
def _connected(dsn: str) -> Iterator[Any]:
    """A connection to ``dsn``; the server's refusals as the CLI's one-line errors (they were
    a traceback): UNAVAILABLE when it cannot be reached, INVALID_ARGUMENT for what it says of
    the command (no such table, no permission)."""
    import psycopg

    try:
        with psycopg.connect(dsn) as conn:
            yield conn
    except psycopg.OperationalError as e:
        raise Unavailable(f"PostgreSQL: {str(e).strip()}") from None
    except psycopg.Error as e:
        raise InvalidArgument(f"PostgreSQL: {str(e).strip()}") from None


def _enable_command(args: Any) -> int:
    with _connected(args.dsn) as conn:
        enable_versioning(conn, args.table, schema=args.schema)
    print(
        f"{args.schema}.{args.table} is system-versioned ({VERSION_MARK}): column sys_period, "
        f"history table {args.schema}.{args.table}_history, triggers harness_versioning and "
        f"harness_versioning_close, index {args.table}_written"
    )
    return 0


def _upgrade_command(args: Any) -> int:
    with _connected(args.dsn) as conn:
        tables = upgrade_versioning(conn)
    if tables:
        print(
            f"versioning upgraded to {VERSION_MARK} on {len(tables)} table(s): {', '.join(tables)}"
        )
    else:
        print(f"nothing to upgrade: every versioned table is at {VERSION_MARK}")
    return 0
