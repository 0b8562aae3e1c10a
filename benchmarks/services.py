"""Throwaway service instances for benchmarks (same conventions as the tests)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from flight_gateway.local import postgres as local_postgres

PG_ADMIN_DSN = local_postgres.admin_dsn()


def _required() -> bool:
    return os.environ.get("HARNESS_REQUIRE_SERVICES", "") not in ("", "0", "false")


@contextmanager
def postgres_server() -> Iterator[None]:
    """The run's PostgreSQL server: the one at ``HARNESS_PG_DSN`` (default loopback), or one
    started for the run (flight_gateway/local/postgres.py). Without one, the benchmarks that
    need it report "skipped", unless ``HARNESS_REQUIRE_SERVICES`` makes that a failure."""
    try:
        server = local_postgres.session_server(PG_ADMIN_DSN)
        running = server.__enter__()
    except local_postgres.Unavailable as e:
        if _required():
            raise SystemExit(f"required service missing: PostgreSQL: {e}") from e
        print(f"PostgreSQL: none ({e}); its benchmark cases are skipped", flush=True)
        yield
        return
    print(running.describe(), flush=True)
    try:
        yield
    finally:
        server.__exit__(None, None, None)


@contextmanager
def postgres_database() -> Iterator[str | None]:
    """A fresh Postgres database (dropped afterwards), or None when Postgres is unreachable."""
    import psycopg

    name = f"harness_bench_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError:
        if _required():
            raise
        yield None
        return
    try:
        yield PG_ADMIN_DSN.rpartition("/")[0] + "/" + name
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
