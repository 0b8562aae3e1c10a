from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clients import HarnessClient
from tests.gateway.helpers import DuckLakeFixture, IcebergFixture, client_for, running_gateway


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
