"""Throwaway service instances for benchmarks (same conventions as the tests)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

PG_ADMIN_DSN = os.environ.get("HARNESS_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextmanager
def postgres_database() -> Iterator[str | None]:
    """A fresh Postgres database (dropped afterwards), or None when Postgres is unreachable."""
    import psycopg

    name = f"harness_bench_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError:
        yield None
        return
    try:
        yield PG_ADMIN_DSN.rpartition("/")[0] + "/" + name
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
