"""A gateway warms the kinds of its sources (``SourceKind.warm``) off the requests' path: when
it starts on a catalog that has them, and when a source of a kind is added. DuckLake is the
kind that has something to warm (a database past the extension's first attach, ~0.16 s)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from planners import ducklake_pool
from tests.gateway.helpers import DuckLakeFixture, client_for, running_gateway


@pytest.fixture
def empty_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ducklake_pool, "_idle", [])
    monkeypatch.setattr(ducklake_pool, "_warmed", False)


def _warmed_within(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ducklake_pool._idle:
            return True
        time.sleep(0.02)
    return False


def test_adding_a_ducklake_source_and_starting_on_one_warm_the_kind(
    tmp_path: Path, empty_pool: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = DuckLakeFixture(tmp_path / "lake")
    snap = lake.execute("CREATE TABLE lake.t (id BIGINT)", "INSERT INTO lake.t VALUES (1)")
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    with running_gateway(url) as (server, _):
        assert not _warmed_within(0.3)  # nothing to warm in an empty catalog
        client = client_for(server)
        try:
            client.create_table("t", [{"name": "id", "type": "int64"}])
            client.add_source("t", "lake", "ducklake", config=lake.source_config("t"),
                              state={"snapshot_id": snap})  # fmt: skip
            assert _warmed_within(10)
            assert client.read("t").column("id").to_pylist() == [1]
        finally:
            client.close()
    monkeypatch.setattr(ducklake_pool, "_idle", [])
    monkeypatch.setattr(ducklake_pool, "_warmed", False)
    with running_gateway(url):
        assert _warmed_within(10)
