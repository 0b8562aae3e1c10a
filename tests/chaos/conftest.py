from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from benchmarks.processes import GatewayProcess


@pytest.fixture
def pg_catalog(pg_dsn: str) -> str:
    """A Postgres catalog in a schema of its own (replicas in production share one)."""
    schema = f"chaos_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return f"{pg_dsn}?options=-csearch_path%3D{schema}"


@pytest.fixture
def gateway_process(pg_catalog: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(pg_catalog, tmp_path)
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()
