"""Reads of a Postgres source reuse idle connections (``planners.postgres.pool``): a stream that
ends normally gives its connection back, one closed early or failed closes it, a pooled
connection the server dropped is replaced without failing the read, and idle ones are closed
after ``idle_s``. Checked on a real server through ``pg_stat_activity``."""

from __future__ import annotations

import gc
import time

import psycopg
import pytest

from clients import HarnessClient
from planners.postgres.cache import CACHE
from planners.postgres.pool import ADBC, ConnectionPool, connect_adbc
from tests.gateway.helpers import versioned_table

pytestmark = pytest.mark.integration

ROWS = 50_000
#: Each row's padding: 50 MB in all, more than gRPC buffers, so a stream closed after its first
#: batch is still in the middle of its COPY (with 100 bytes a row, a loaded machine's server
#: could finish the whole stream into gRPC's buffers first, and rightly pool the connection).
PAD = 1000


@pytest.fixture
def table(client: HarnessClient, pg_dsn: str) -> str:
    ADBC.clear()
    name, as_of = versioned_table(
        pg_dsn,
        "pool",
        "id bigint primary key, pad text",
        f"SELECT i, repeat('p', {PAD}) FROM generate_series(1, {ROWS}) i",
    )
    client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "pad", "type": "string"}])
    client.add_source(
        "t",
        "pg",
        "postgres",
        config={"dsn": pg_dsn, "table": name, "tasks": 1},
        state={"as_of": as_of},
    )
    return name


def _sessions(dsn: str, name: str) -> dict[int, tuple[str, object]]:
    """pid -> (state, query_start) of the other sessions whose last query read ``name``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, state, query_start FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE %s",
            (f"%{name}%",),
        ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def _ids(client: HarnessClient) -> list[int]:
    return sorted(client.read("t", columns=["id"]).column("id").to_pylist())


def test_a_second_read_runs_on_the_first_reads_connection(
    client: HarnessClient, pg_dsn: str, table: str
) -> None:
    assert _ids(client) == list(range(1, ROWS + 1))
    first = _sessions(pg_dsn, table)
    assert first and all(state == "idle" for state, _ in first.values()), first
    CACHE.clear()  # or the second read is served its pinned rows from the first's
    assert _ids(client) == list(range(1, ROWS + 1))
    second = _sessions(pg_dsn, table)
    assert set(second) == set(first)  # no new session read the table
    assert any(second[pid][1] > first[pid][1] for pid in first)  # and one of them ran again


def test_a_stream_closed_early_closes_its_connection(
    client: HarnessClient, pg_dsn: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ADBC, "idle_s", 600.0)  # so only the stream's end can close it
    (ep,) = client.flight_info("t").endpoints
    reader = client.read_endpoint(ep)
    assert reader.read_next_batch().num_rows > 0
    reader.close()
    del reader
    deadline = time.monotonic() + 30
    while _sessions(pg_dsn, table) and time.monotonic() < deadline:
        gc.collect()  # the in-process server's abandoned stream, if a cycle holds it
        time.sleep(0.1)
    assert _sessions(pg_dsn, table) == {}  # closed mid-COPY, not pooled
    assert ADBC.idle_count() == 0
    assert _ids(client) == list(range(1, ROWS + 1))


def test_a_pooled_connection_the_server_dropped_is_replaced(
    client: HarnessClient, pg_dsn: str, table: str
) -> None:
    assert _ids(client) == list(range(1, ROWS + 1))
    pooled = _sessions(pg_dsn, table)
    assert pooled and ADBC.idle_count() >= 1
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for pid in pooled:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    assert _ids(client) == list(range(1, ROWS + 1))
    assert not set(_sessions(pg_dsn, table)) & set(pooled)


def test_idle_connections_are_closed_after_idle_s(pg_dsn: str) -> None:
    pool = ConnectionPool(connect_adbc, idle_s=0.3)
    con, fresh = pool.take(pg_dsn)
    assert fresh
    cur = con.cursor()
    cur.execute("SELECT pg_backend_pid()")
    (pid,) = cur.fetchone()
    cur.close()
    pool.give(pg_dsn, con)
    again, fresh = pool.take(pg_dsn)
    assert not fresh and again is con
    pool.give(pg_dsn, again)
    deadline = time.monotonic() + 10
    while pool.idle_count() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pool.idle_count() == 0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchall():
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"backend {pid} still open after the pool's sweep")


def test_the_pool_keeps_as_many_idle_as_were_in_flight_under_its_ceiling(pg_dsn: str) -> None:
    """Sized to demand: six reads at once leave six idle connections (the server's share,
    an eighth of its connections, is larger); once demand falls a sweep brings the size back
    to ``per_dsn``."""
    from planners.postgres.pool import server_share

    pool = ConnectionPool(connect_adbc, per_dsn=2, ceiling=server_share)
    taken = [pool.take(pg_dsn)[0] for _ in range(6)]
    for con in taken:
        pool.give(pg_dsn, con)
    assert pool.idle_count(pg_dsn) == 6 and pool.keep(pg_dsn) == 6
    pool.sweep()  # nothing in flight now
    assert pool.keep(pg_dsn) == 2
    pool.clear()
    assert pool.idle_count() == 0


def test_the_ceiling_bounds_what_is_kept_idle(pg_dsn: str) -> None:
    pool = ConnectionPool(connect_adbc, per_dsn=2, ceiling=lambda _con: 3)
    taken = [pool.take(pg_dsn)[0] for _ in range(6)]
    for con in taken:
        pool.give(pg_dsn, con)
    assert pool.idle_count(pg_dsn) == 3 and pool.keep(pg_dsn) == 3
    pool.clear()
