from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients import HarnessClient
from tests.gateway.helpers import DuckLakeFixture, IcebergFixture, client_for, running_gateway
from tests.services import (
    fresh_postgres_database,
    kafka_broker,
    postgres_servers,
    start_postgres,
    stop_postgres,
)

_POSTGRES_LINE = ""


def pytest_sessionstart(session: pytest.Session) -> None:
    """Bring up the session's PostgreSQL server before anything runs (tests/services.py), and
    say which one it is, in the header, or on its own line under ``-q`` (which hides the
    header), so a CI log always shows it."""
    global _POSTGRES_LINE
    _POSTGRES_LINE = start_postgres()
    if session.config.get_verbosity() < 0:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(_POSTGRES_LINE)


def pytest_report_header(config: pytest.Config) -> str:
    return _POSTGRES_LINE


def pytest_sessionfinish(session: pytest.Session) -> None:
    stop_postgres()


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """DSN of a PostgreSQL database created for this test session."""
    with fresh_postgres_database() as dsn:
        yield dsn


@pytest.fixture(scope="session")
def pg_shards() -> Iterator[list[str]]:
    """Admin DSNs of three extra PostgreSQL servers (shards), made for this session."""
    with postgres_servers(3) as dsns:
        yield dsns


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


@pytest.fixture(scope="session")
def hudi_spark() -> Iterator[object]:
    """One Spark with Hudi's Spark bundle for the session: writes the Hudi tables the ``hudi``
    kind reads and reads them itself, as the oracle (flight_gateway/local/hudi.py)."""
    from flight_gateway.local.hudi import HudiSpark
    from flight_gateway.protocol.errors import Unavailable
    from tests.services import missing

    try:
        spark = HudiSpark()
    except Unavailable as e:
        missing(f"Spark with Hudi's bundle: {e}")
        return
    with spark:
        yield spark


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


@pytest.fixture(scope="session")
def jsonl_kind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The out-of-tree ``jsonl`` source kind (tests/plugins/harness_jsonl), installed the way a
    user installs a plugin — ``pip install`` of its package, here into a directory put on the
    path — and found by the gateway through its entry point, with no edit to the project."""
    import importlib
    import subprocess
    import sys

    target = tmp_path_factory.mktemp("plugins")
    package = Path(__file__).parent / "plugins" / "harness_jsonl"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(package),
        ],
        check=True,
    )
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    try:
        yield "jsonl"
    finally:
        sys.path.remove(str(target))
