"""Test helpers: hold a table's catalog lock from outside, wait for queued commits."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator

from sqlalchemy.engine import make_url

from flight_gateway.catalog import Catalog
from flight_gateway.catalog.commit import GroupStats


@contextlib.contextmanager
def table_row_held(catalog_url: str, table: str) -> Iterator[None]:
    """Hold what every commit to ``table`` must take first (the row lock on Postgres, the
    database write lock on SQLite), from a connection of its own, until the block ends."""
    url = make_url(catalog_url)
    if url.get_backend_name() == "sqlite":
        con = sqlite3.connect(url.database or "", isolation_level=None, timeout=60)
        con.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            con.execute("ROLLBACK")
            con.close()
        return
    import psycopg

    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT 1 FROM harness_tables WHERE name = %s FOR UPDATE", (table,))
        yield
        conn.rollback()


def wait_for_orphans(catalog_url: str, timeout_s: float = 30) -> None:
    """Wait until no other session of the catalog database is busy. A statement a killed
    process had sent still runs to its end on a Postgres server (one waiting for a lock runs
    once the lock is free): a check that read the catalog before it landed saw the current
    version before it and the history after it. SQLite has no server: nothing outlives the
    process."""
    url = make_url(catalog_url)
    if url.get_backend_name() == "sqlite":
        return
    import psycopg

    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:

        def settled() -> bool:
            busy = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
                "AND state <> 'idle'"
            ).fetchone()
            return busy is not None and busy[0] == 0

        _wait(settled, "the killed process's statements to end", timeout_s)


def _wait(cond: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def wait_queued(cat: Catalog, table: str, n: int) -> None:
    """Wait until ``n`` commits to ``table`` wait behind the group being applied."""
    groups = cat._commits._groups
    assert groups is not None, "group commit is off"
    _wait(lambda: groups.queued(table) >= n, f"{n} queued commits")


def wait_groups(cat: Catalog, n: int) -> None:
    """Wait until ``n`` groups have been taken by their leaders (applied or being applied)."""
    _wait(lambda: (cat.group_commit_stats() or GroupStats(0, 0, 0)).groups >= n, f"{n} groups")
