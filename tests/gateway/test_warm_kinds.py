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


def test_a_kind_used_while_it_warms_waits_for_its_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A use of a kind (``get_kind``) while its warm-up runs waits for it, rather than
    importing the same library beside it; a kind with nothing to warm is not waited for."""
    import threading

    from planners import registry
    from planners.kind import SourceKind

    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    class Slow(SourceKind):
        def warm(self) -> None:
            started.set()
            release.wait(10)
            finished.set()

    monkeypatch.setitem(registry._instances, "slow", Slow())
    monkeypatch.setitem(registry._instances, "plain", SourceKind())
    monkeypatch.setattr(registry, "_warming", {})
    registry.warm(["slow", "plain"])
    assert started.wait(10)
    assert registry.get_kind("plain") is registry._instances["plain"]  # not waited for
    got: list[bool] = []
    user = threading.Thread(target=lambda: got.append(bool(registry.get_kind("slow"))))
    user.start()
    user.join(0.3)
    assert user.is_alive() and not got  # waiting for the warm-up
    release.set()
    user.join(10)
    assert finished.is_set() and got == [True]


def test_a_warmed_iceberg_kind_plans_its_first_table_without_importing(tmp_path: Path) -> None:
    """In a fresh process, after the Iceberg kind's warm-up, a table's first plan imports no
    module of pyiceberg's or the kind's (before: 250 modules, 0.5-0.8 s)."""
    import json
    import subprocess
    import sys

    import pyarrow as pa

    from tests.gateway.helpers import IcebergFixture

    ice = IcebergFixture(tmp_path)
    table = ice.create("t", pa.schema([pa.field("id", pa.int64())]))
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    snap = table.current_snapshot().snapshot_id
    child = """
import json, sys
import flight_gateway.app
from planners import registry
from planners.kind import ColumnSpec, ScanRequest, SourceRef
registry.warm(["iceberg"])
kind = registry.get_kind("iceberg")  # waits for the warm-up
before = set(sys.modules)
source = SourceRef("s", "iceberg", json.loads(sys.argv[1]), {}, {"snapshot_id": int(sys.argv[2])})
tasks = kind.plan(ScanRequest(source, (ColumnSpec(1, "id", "int64"),)))
new = sorted(m for m in set(sys.modules) - before if m.startswith(("pyiceberg", "planners")))
print(json.dumps({"tasks": len(tasks), "new": new}))
"""
    out = subprocess.run(
        [sys.executable, "-c", child, json.dumps(ice.source_config("t")), str(snap)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["tasks"] >= 1 and got["new"] == []


def test_every_kinds_warm_imports_are_modules() -> None:
    import importlib

    from planners import registry

    for name in ("iceberg", "delta", "paimon", "postgres", "kafka", "hudi"):
        for module in registry.get_kind(name).warm_imports:
            importlib.import_module(module)


def test_a_read_process_warms_before_it_says_it_is_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """``warm(..., wait=True)`` (a read process, before it answers the gateway) returns when
    each kind is warm: the first reads of a kind no longer import its libraries while holding
    a place of ``read_processes_running``."""
    from flight_gateway.faces.flight import read_process
    from planners import registry
    from planners.kind import SourceKind

    warmed: list[str] = []

    class Slow(SourceKind):
        def warm(self) -> None:
            time.sleep(0.2)
            warmed.append("slow")

    class Catalog:
        def source_kinds(self) -> list[str]:
            return ["slow"]

    monkeypatch.setitem(registry._instances, "slow", Slow())
    monkeypatch.setattr(registry, "_warming", {})
    read_process._warm(Catalog())  # type: ignore[arg-type]
    assert warmed == ["slow"] and registry._warming["slow"].is_set()
