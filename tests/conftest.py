from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients import HarnessClient
from tests.gateway.helpers import DuckLakeFixture, IcebergFixture, client_for, running_gateway
from tests.services import fresh_postgres_database, kafka_broker


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """DSN of a PostgreSQL database created for this test session."""
    with fresh_postgres_database() as dsn:
        yield dsn


@pytest.fixture(params=["sqlite", "postgres"])
def catalog_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh, empty catalog location on each backend (Postgres: a schema of its own)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'catalog.db'}"
    import psycopg

    dsn = request.getfixturevalue("pg_dsn")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return f"{dsn}?options=-csearch_path%3D{schema}"


@pytest.fixture
def catalog(catalog_url: str):
    from flight_gateway.catalog import Catalog

    cat = Catalog(catalog_url)
    yield cat
    cat.close()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    with kafka_broker() as bootstrap:
        yield bootstrap


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[object, object]]:
    with running_gateway(f"sqlite:///{tmp_path / 'catalog.db'}") as (server, cat):
        yield server, cat


@pytest.fixture
def client(gateway) -> Iterator[HarnessClient]:
    server, _ = gateway
    c = client_for(server)
    yield c
    c.close()


@pytest.fixture
def iceberg(tmp_path: Path) -> IcebergFixture:
    return IcebergFixture(tmp_path / "ice")


@pytest.fixture
def ducklake(tmp_path: Path) -> DuckLakeFixture:
    return DuckLakeFixture(tmp_path / "lake")
