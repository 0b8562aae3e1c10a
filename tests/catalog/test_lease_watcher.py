"""The lease watcher (``catalog.locks.watch``) frees a dead gateway's leases on a connection it
made when it learned of the catalog (not by importing SQLAlchemy at the death), and still frees
them when the server closed that connection meanwhile. A real watcher process against a real
PostgreSQL catalog; the gateway's side of the pipe is the test's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from flight_gateway.catalog import Catalog, db
from flight_gateway.catalog.locks import watch

pytestmark = pytest.mark.integration


@pytest.fixture
def pg_catalog(pg_dsn: str) -> Iterator[tuple[Catalog, str]]:
    schema = f"w_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{pg_dsn}?options=-csearch_path%3D{schema}"
    with Catalog(url) as cat:
        cat.create_table("t", [{"name": "id", "type": "int64"}])
        cat.commit("t", "setup", add_sources=[{"name": "s", "kind": "files", "state": {}}])
        yield cat, url


def _wait_for(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def _watcher_backends(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [watch.APPLICATION]
        ).fetchall()
    return [int(pid) for (pid,) in rows]


def _watch(url: str, lock_id: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "flight_gateway.catalog.locks.watch"], stdin=subprocess.PIPE
    )
    assert proc.stdin is not None
    lines = [{"catalog": 0, "url": url}, {"hold": lock_id, "catalog": 0}]
    proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
    proc.stdin.flush()
    return proc


def _granted(cat: Catalog) -> list[Any]:
    return [lk for lk in cat.list_locks("t") if lk.granted]


@pytest.mark.parametrize("server_closed_it", [False, True])
def test_the_watcher_frees_leases_on_the_connection_it_made_ahead(
    pg_catalog: tuple[Catalog, str], pg_dsn: str, server_closed_it: bool
) -> None:
    cat, url = pg_catalog
    grant = cat.lock("t", ["s"], owner="doput", ttl_s=600, wait_s=0)
    before = set(_watcher_backends(pg_dsn))
    proc = _watch(url, grant.lock_id)
    try:
        # Connected while the gateway lives, before any lease is to be freed.
        _wait_for(lambda: set(_watcher_backends(pg_dsn)) - before, 30)
        mine = sorted(set(_watcher_backends(pg_dsn)) - before)
        if server_closed_it:  # a restarted server, an idle timeout: a new connection then
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                for pid in mine:
                    conn.execute("SELECT pg_terminate_backend(%s)", [pid])
        assert _granted(cat)
        assert proc.stdin is not None
        proc.stdin.close()  # the gateway died
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    assert not _granted(cat)
    assert set(_watcher_backends(pg_dsn)) <= before


def test_its_table_is_the_catalogs() -> None:
    assert db.locks.name == watch.LOCKS_TABLE
    assert watch.conninfo("postgresql+psycopg://u:p%40w@h:5/d?options=-csearch_path%3Dx") == (
        "postgresql://u:p%40w@h:5/d?options=-csearch_path%3Dx"
    )
    assert watch.conninfo("sqlite:///x.db") is None
