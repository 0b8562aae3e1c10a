"""A versioned Postgres source read as several tasks (key ranges of its primary key), each on
its own connection: the union of the tasks is exactly the pinned rows, even while writers
update keys, move rows to history and delete them between the tasks' reads."""

from __future__ import annotations

import psycopg
import pytest

from clients import HarnessClient
from planners.postgres import split
from tests.gateway.helpers import versioned_table

pytestmark = pytest.mark.integration

ROWS = 60_000


@pytest.fixture
def big(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    monkeypatch.setattr(split, "TARGET_BYTES", 1 << 20)  # a few MB table -> several tasks
    name, as_of = versioned_table(
        pg_dsn,
        "par",
        "id bigint primary key, v numeric(12,2), pad text",
        f"SELECT i, i * 0.5, repeat('x', 60) FROM generate_series(1, {ROWS}) i",
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'ANALYZE "{name}"')
    return name, as_of


def _rows(client: HarnessClient) -> list[tuple[int, str]]:
    t = client.read("p", columns=["id", "v"])
    return sorted(zip(t.column("id").to_pylist(), map(str, t.column("v").to_pylist()), strict=True))


def test_a_big_table_reads_as_several_exact_tasks(
    client: HarnessClient, pg_dsn: str, big: tuple[str, str]
) -> None:
    name, as_of = big
    client.create_table(
        "p",
        [
            {"name": "id", "type": "int64"},
            {"name": "v", "type": "decimal128(12, 2)"},
            {"name": "pad", "type": "string"},
        ],
    )
    client.add_source(
        "p",
        "pg",
        "postgres",
        config={"dsn": pg_dsn, "table": name, "tasks": 4},
        state={"as_of": as_of},
    )
    info = client.flight_info("p", columns=["id", "v"])
    assert len(info.endpoints) == 4
    expected = [(i, f"{i * 0.5:.2f}") for i in range(1, ROWS + 1)]
    assert _rows(client) == expected

    # Writers move versions between the tables and between key ranges while tasks are read
    # one after the other: every task still sees its pinned versions exactly once.
    readers = [client.read_endpoint(e).read_all() for e in info.endpoints[:2]]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{name}" SET id = id + {ROWS} WHERE id % 7 = 0')
        conn.execute(f'UPDATE "{name}" SET v = 0 WHERE id % 5 = 0')
        conn.execute(f'DELETE FROM "{name}" WHERE id % 11 = 0')
    readers += [client.read_endpoint(e).read_all() for e in info.endpoints[2:]]
    got = sorted(
        (i, str(v))
        for t in readers
        for i, v in zip(t.column("id").to_pylist(), t.column("v").to_pylist(), strict=True)
    )
    assert got == expected


def test_without_a_primary_key_it_is_one_task(
    client: HarnessClient, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(split, "TARGET_BYTES", 1 << 16)
    name, as_of = versioned_table(
        pg_dsn, "nopk", "id bigint", "SELECT i FROM generate_series(1, 20000) i"
    )
    client.create_table("n", [{"name": "id", "type": "int64"}])
    client.add_source(
        "n", "pg", "postgres", config={"dsn": pg_dsn, "table": name}, state={"as_of": as_of}
    )
    assert len(client.flight_info("n").endpoints) == 1
    assert client.read("n").num_rows == 20000


def test_a_selective_filter_reads_as_one_task(
    client: HarnessClient, pg_dsn: str, big: tuple[str, str]
) -> None:
    """Each key-range task scans the whole table: a read the server expects to keep few rows
    is one task (Postgres parallelises that scan itself), an unselective one is split."""
    name, as_of = big
    client.create_table("s", [{"name": "id", "type": "int64"}, {"name": "pad", "type": "string"}])
    client.add_source(
        "s",
        "pg",
        "postgres",
        config={"dsn": pg_dsn, "table": name, "tasks": 4},
        state={"as_of": as_of},
    )
    assert len(client.flight_info("s", filter="id >= 0").endpoints) == 4
    selective = "id BETWEEN 100 AND 140 AND pad LIKE 'x%'"
    assert len(client.flight_info("s", filter=selective).endpoints) == 1
    assert client.read("s", filter=selective).column("id").to_pylist() == list(range(100, 141))


def test_a_task_streams_from_the_server(client: HarnessClient, pg_dsn: str) -> None:
    """The pinned rows leave Postgres through COPY (no bound parameters), so the first batch
    arrives while the server is still sending: a prepared statement with parameters makes
    libpq buffer the whole result first (3x slower, and all of it in memory)."""
    name, as_of = versioned_table(
        pg_dsn,
        "stream",
        "id bigint primary key, pad text",
        "SELECT i, repeat('y', 200) FROM generate_series(1, 400000) i",
    )
    client.create_table("st", [{"name": "id", "type": "int64"}, {"name": "pad", "type": "string"}])
    client.add_source(
        "st",
        "pg",
        "postgres",
        config={"dsn": pg_dsn, "table": name, "tasks": 1},
        state={"as_of": as_of},
    )
    (ep,) = client.flight_info("st", filter="pad <> 'z''s'").endpoints
    reader = client.read_endpoint(ep)
    first = reader.read_next_batch()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        running = [
            r[0]
            for r in conn.execute(
                "SELECT query FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND query LIKE %s",
                (f"%{name}%",),
            ).fetchall()
        ]
    rest = reader.read_all()
    assert first.num_rows + rest.num_rows == 400_000
    assert running and all(q.lstrip().upper().startswith("COPY") for q in running), running
