"""Postgres sources: system-versioned tables read as of the pinned ``as_of``."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import InvalidArgument
from planners.postgres.versioning import enable_versioning, server_now

pytestmark = pytest.mark.integration

SCHEMA = [
    {"name": "id", "type": "int64"},
    {"name": "name", "type": "string"},
    {"name": "amount", "type": "decimal128(10, 2)"},
]


@pytest.fixture
def pg_table(pg_dsn: str) -> str:
    name = f"items_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{name}" (id bigint PRIMARY KEY, name text, amount numeric(10, 2))'
        )
        enable_versioning(conn, name)
    return name


def add_pg_source(client: HarnessClient, dsn: str, table: str, as_of: str) -> int:
    client.create_table("t", SCHEMA)
    return client.add_source(
        "t", "pg", "postgres", config={"dsn": dsn, "table": table}, state={"as_of": as_of}
    )


def test_read_as_of_and_types(client: HarnessClient, pg_dsn: str, pg_table: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO \"{pg_table}\" SELECT g, 'n' || g, g * 1.5 FROM generate_series(1, 100) g"
        )
        t1 = server_now(conn)
        conn.execute(f"UPDATE \"{pg_table}\" SET name = 'changed' WHERE id <= 10")
        conn.execute(f'DELETE FROM "{pg_table}" WHERE id > 90')
        conn.execute(f"INSERT INTO \"{pg_table}\" VALUES (1000, 'new', 1)")
        t2 = server_now(conn)
    v1 = add_pg_source(client, pg_dsn, pg_table, t1)
    v2 = client.commit("t", updates=[{"source": "pg", "state": {"as_of": t2}}])
    old = client.read("t", version=v1).sort_by("id")
    assert old.num_rows == 100 and old.column("name").to_pylist()[:2] == ["n1", "n2"]
    assert (
        str(old.column("amount").type) == "decimal128(10, 2)"
        and float(old.column("amount")[1].as_py()) == 3.0
    )
    new = client.read("t", version=v2).sort_by("id")
    assert new.num_rows == 91 and new.column("name").to_pylist()[:2] == ["changed", "changed"]
    assert (
        client.read("t", version=v2, filter="name LIKE 'ch%' AND id > 5", columns=["id"]).num_rows
        == 5
    )
    assert client.read("t", version=v1, filter="amount >= 149.5").column("id").to_pylist() == [100]


def test_sql_injection_attempts_fail_harmlessly(
    client: HarnessClient, pg_dsn: str, pg_table: str
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{pg_table}" VALUES (1, %s, 1)', (f"x'); DROP TABLE {pg_table}; --",)
        )
        # Values travel as literals (E'...' strings): backslashes and quotes must stay data.
        for i, text in enumerate(["a\\'b", "c\\", "\\' OR 1=1 --", "d\\nx"], start=2):
            conn.execute(f'INSERT INTO "{pg_table}" VALUES (%s, %s, 1)', (i, text))
        as_of = server_now(conn)
    add_pg_source(client, pg_dsn, pg_table, as_of)
    for i, text in enumerate(["a\\''b", "c\\", "\\'' OR 1=1 --", "d\\nx"], start=2):
        assert client.read("t", filter=f"name = '{text}'").column("id").to_pylist() == [i]
    assert client.read("t", filter="name IN ('c\\', 'zz')").column("id").to_pylist() == [3]
    assert client.read("t", filter="name LIKE 'c\\%'").column("id").to_pylist() == [3]
    with pytest.raises(InvalidArgument, match="NUL"):  # Postgres text cannot hold one
        client.read("t", filter="name = 'a\x00b'")
    evil = f"x''); DROP TABLE {pg_table}; --"  # SQL-escaped form of the stored value
    assert client.read("t", filter=f"name = '{evil}'").column("id").to_pylist() == [1]
    assert client.read("t", filter="name LIKE 'x''); DROP TABLE %'").num_rows == 1
    for bad in [
        f"name = 'a' ; DROP TABLE {pg_table}",
        "id = 1 OR 1=1",
        "name = (SELECT current_user)",
        '"id"; DROP TABLE x = 1',
    ]:
        with pytest.raises(InvalidArgument):
            client.read("t", filter=bad)
    with pytest.raises(InvalidArgument, match="unknown column"):
        client.read("t", columns=[f'id"; DROP TABLE {pg_table}; --'])
    with psycopg.connect(pg_dsn) as conn:  # the table is still there and intact
        assert conn.execute(f'SELECT count(*) FROM "{pg_table}"').fetchone() == (5,)


@pytest.mark.slow
def test_pinned_reads_repeatable_under_concurrent_writes(
    client: HarnessClient, pg_dsn: str, pg_table: str
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        add_pg_source(client, pg_dsn, pg_table, server_now(conn))
    model: dict[int, str] = {}
    expected: dict[int, dict[int, str]] = {}
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        rng = random.Random(7)
        try:
            with psycopg.connect(pg_dsn) as conn:
                i = 0
                while not stop.is_set():
                    i += 1
                    with client.lock("t", ["pg"], owner="writer", ttl_s=30, wait_s=10) as lock:
                        with conn.transaction():
                            for _ in range(5):
                                op = rng.random()
                                if op < 0.5 or not model:
                                    k = rng.randrange(10_000)
                                    conn.execute(
                                        f'INSERT INTO "{pg_table}" VALUES (%s, %s, 1) ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name',
                                        (k, f"v{i}"),
                                    )
                                    model[k] = f"v{i}"
                                elif op < 0.8:
                                    k = rng.choice(list(model))
                                    conn.execute(
                                        f'UPDATE "{pg_table}" SET name = %s WHERE id = %s',
                                        (f"u{i}", k),
                                    )
                                    model[k] = f"u{i}"
                                else:
                                    k = rng.choice(list(model))
                                    conn.execute(f'DELETE FROM "{pg_table}" WHERE id = %s', (k,))
                                    del model[k]
                        as_of = server_now(conn)  # after the write committed, under the lock
                        v = client.commit(
                            "t", lock=lock, updates=[{"source": "pg", "state": {"as_of": as_of}}]
                        )
                        expected[v] = dict(model)
        except BaseException as e:
            errors.append(e)

    th = threading.Thread(target=writer)
    th.start()
    first_reads: dict[int, list] = {}
    try:
        # At least 5 s and 3 versions read (a loaded machine is slow, never wrong).
        start = time.monotonic()
        while (time.monotonic() - start < 5 or len(first_reads) < 3) and (
            time.monotonic() - start < 120
        ):
            for v in list(expected)[-3:]:
                rows = sorted(
                    client.read("t", version=v, columns=["id", "name"]).to_pylist(),
                    key=lambda r: r["id"],
                )
                assert {r["id"]: r["name"] for r in rows} == expected[v]
                first_reads.setdefault(v, rows)
                assert rows == first_reads[v]  # repeatable
    finally:
        stop.set()
        th.join()
    assert not errors, errors
    assert len(first_reads) >= 3
    for v, rows in list(first_reads.items())[:5]:  # still identical after all later writes
        assert (
            sorted(
                client.read("t", version=v, columns=["id", "name"]).to_pylist(),
                key=lambda r: r["id"],
            )
            == rows
        )


def test_cli_enable_versioning(pg_dsn: str) -> None:
    name = f"cli_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{name}" (id int)')
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "flight_gateway.cli", "postgres", "enable-versioning", pg_dsn, name],
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"public.{name} is system-versioned"), out.stdout
    assert len(out.stdout.splitlines()) == 1
    upgrade = subprocess.run(
        [sys.executable, "-m", "flight_gateway.cli", "postgres", "upgrade-versioning", pg_dsn],
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert upgrade.returncode == 0, upgrade.stderr
    assert upgrade.stdout.startswith("nothing to upgrade"), upgrade.stdout
    # The server's refusals are one line on stderr and status 1, not a traceback.
    cli = [sys.executable, "-m", "flight_gateway.cli", "postgres", "enable-versioning"]
    for dsn, table, said in [(pg_dsn, f"missing_{name}", "does not exist"),
                             ("postgresql://postgres@127.0.0.1:1/x", name, "PostgreSQL")]:  # fmt: skip
        failed = subprocess.run([*cli, dsn, table], env={**os.environ, "PYTHONPATH": str(root)},
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert failed.returncode == 1, failed.stderr
        assert said in failed.stderr and "Traceback" not in failed.stderr, failed.stderr
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'INSERT INTO "{name}" VALUES (1)')
        conn.execute(f'DELETE FROM "{name}"')
        assert conn.execute(f'SELECT count(*) FROM "{name}_history"').fetchone() == (1,)


def test_server_now_refuses_inside_a_write_transaction(pg_dsn: str, pg_table: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f"INSERT INTO \"{pg_table}\" VALUES (1, 'a', 1)")  # implicit transaction open
        with pytest.raises(RuntimeError, match="commit the write transaction"):
            server_now(conn)
        conn.commit()
        server_now(conn)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
