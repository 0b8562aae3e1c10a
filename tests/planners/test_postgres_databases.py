"""ADBC connections of one DSN opened from one kept driver database
(``planners.postgres.databases``): they share it, open and close concurrently without leaving
its connection count wrong, and a type created after the database was made is read as its
values (the read renews the database and runs again), not as the driver's opaque bytes."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pyarrow as pa
import pytest

from clients import HarnessClient
from planners.postgres import databases
from planners.postgres.cache import CACHE
from planners.postgres.databases import Databases, unknown_types
from planners.postgres.pool import ADBC
from tests.gateway.helpers import versioned_table

pytestmark = pytest.mark.integration


def _one(con: object) -> object:
    cur = con.cursor()  # type: ignore[attr-defined]
    try:
        cur.execute("SELECT pg_backend_pid()")
        return cur.fetchone()[0]
    finally:
        cur.close()


def test_connections_of_a_dsn_share_one_database(pg_dsn: str) -> None:
    dbs = Databases()
    cons = [dbs.connect(pg_dsn) for _ in range(3)]
    try:
        assert len({id(c.harness_database) for c in cons}) == 1
        assert len({_one(c) for c in cons}) == 3  # three sessions of the server
    finally:
        for c in cons:
            c.close()
        dbs.clear()


def test_concurrent_opens_and_closes_leave_the_database_releasable(pg_dsn: str) -> None:
    dbs = Databases()
    held = dbs.connect(pg_dsn)
    database = held.harness_database
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            for _ in range(10):
                con = dbs.connect(pg_dsn)
                _one(con)
                con.close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    held.close()
    dbs._kept.clear()  # let go of the holder's reference here, not quietly in clear()
    database.shared.close()  # the driver refuses to release a database it counts in use


def test_unknown_types_are_found_at_any_depth() -> None:
    opaque = pa.opaque(pa.binary(), "unnamed<oid:123456>", "PostgreSQL")
    known = pa.opaque(pa.string(), "numeric", "PostgreSQL")
    assert unknown_types(pa.schema([("a", pa.int64()), ("m", opaque)]))
    assert unknown_types(pa.schema([("l", pa.list_(opaque))]))
    assert unknown_types(pa.schema([("s", pa.struct([("x", opaque)]))]))
    assert not unknown_types(pa.schema([("n", known), ("l", pa.list_(pa.string()))]))
    assert unknown_types(pa.schema([("a", opaque), ("b", pa.list_(opaque))])) == {
        "unnamed<oid:123456>"
    }


def test_a_type_the_driver_never_reads_renews_once(
    client: HarnessClient,
    pg_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The driver's catalogue leaves out range types: a database made after one does not
    know it either. The first read renews (its database was old), the next ones do not."""
    caplog.set_level(logging.INFO, logger=databases.__name__)
    monkeypatch.setattr(databases, "DATABASES", Databases())  # nothing learnt before
    monkeypatch.setattr("planners.postgres.DATABASES", databases.DATABASES)
    ADBC.clear()
    name, as_of = versioned_table(
        pg_dsn, "ranges", "id bigint primary key, r int4range", "VALUES (1, int4range(1, 5))"
    )
    client.create_table("r", [{"name": "id", "type": "int64"}, {"name": "r", "type": "binary"}])
    client.add_source(
        "r", "pg", "postgres", config={"dsn": pg_dsn, "table": name}, state={"as_of": as_of}
    )
    ADBC.run(pg_dsn, _one)
    time.sleep(databases.FRESH_S + 0.1)
    for _ in range(3):
        CACHE.clear()  # each read asks the server
        got = client.read("r")
        assert got.column("id").to_pylist() == [1] and got.column("r")[0].as_py()
        time.sleep(databases.FRESH_S + 0.1)  # the database the last read made is old by the next
    assert caplog.text.count("its types read again") == 1


@pytest.fixture
def mood(pg_dsn: str) -> Iterator[str]:
    name = f"mood_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP TYPE IF EXISTS "{name}" CASCADE')


def test_a_type_made_after_the_database_is_read_as_its_values(
    client: HarnessClient,
    pg_dsn: str,
    mood: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=databases.__name__)
    ADBC.clear()
    CACHE.clear()
    ADBC.run(pg_dsn, _one)  # a database made now, and an idle connection of it pooled
    time.sleep(databases.FRESH_S + 0.1)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TYPE \"{mood}\" AS ENUM ('ok', 'sad')")
    name, as_of = versioned_table(
        pg_dsn,
        "moods",
        f'id bigint primary key, m "{mood}", ms "{mood}"[]',
        f"SELECT i, CASE WHEN i % 2 = 0 THEN 'ok' ELSE 'sad' END::\"{mood}\", "
        f"ARRAY['ok', 'sad']::\"{mood}\"[] FROM generate_series(1, 5) i",
    )
    client.create_table(
        "moods",
        [
            {"name": "id", "type": "int64"},
            {"name": "m", "type": "string"},
            {"name": "ms", "type": "list<item: string>"},
        ],
    )
    client.add_source(
        "moods", "pg", "postgres", config={"dsn": pg_dsn, "table": name}, state={"as_of": as_of}
    )
    got = client.read("moods").sort_by("id")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        want = conn.execute(f'SELECT id, m::text, ms::text[] FROM "{name}" ORDER BY id').fetchall()
    assert list(zip(*(c.to_pylist() for c in got.columns), strict=True)) == [
        (i, m, list(ms)) for i, m, ms in want
    ]
    assert "its types read again" in caplog.text  # the pooled connection's database was old
