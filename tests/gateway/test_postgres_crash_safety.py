"""The versioning triggers never take a user's PostgreSQL server down (issue 20).

PostgreSQL 15 crashes the backend, and resets the whole cluster, when a plpgsql trigger assigns
to ``OLD`` for a row stored before a column was added with a fast default. The harness's own
``enable_versioning`` adds ``sys_period`` that way, so every row of a table that held rows before
it was versioned is such a row. Each test here runs on every PostgreSQL server the tests start
(the session database's server and the three shard servers), and checks after its statements
that a connection opened before them still answers (a backend crash terminates every
connection) and that the postmaster did not restart.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from clients import HarnessClient
from planners.postgres.versioning import (
    VERSION_MARK,
    enable_versioning,
    outdated_schemas,
    server_now,
    upgrade_versioning,
)

pytestmark = pytest.mark.integration

SERVERS = ["session", "shard-0", "shard-1", "shard-2"]
SCHEMA = [
    {"name": "id", "type": "int64"},
    {"name": "name", "type": "string"},
    {"name": "qty", "type": "int64"},
    {"name": "note", "type": "string"},
    {"name": "score", "type": "int64"},
]
Rows = dict[int, dict[str, Any]]


def snapshot(model: Rows) -> list[dict[str, Any]]:
    return [dict(model[i]) for i in sorted(model)]


@pytest.fixture(params=SERVERS)
def server_dsn(request: pytest.FixtureRequest) -> str:
    if request.param == "session":
        return str(request.getfixturevalue("pg_dsn"))
    shards = request.getfixturevalue("pg_shards")
    return str(shards[int(request.param.rpartition("-")[2])])


@contextmanager
def server_survives(dsn: str) -> Iterator[None]:
    """Fails unless a connection opened before the block still answers after it, on the same
    backend, and the postmaster kept its start time."""
    watch = psycopg.connect(dsn, autocommit=True)
    try:
        pid = watch.info.backend_pid
        started = watch.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
        yield
        assert watch.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
        assert watch.execute("SELECT pg_postmaster_start_time()").fetchone()[0] == started
    finally:
        watch.close()


def table_with_old_rows(conn: psycopg.Connection, name: str) -> Rows:
    """A table holding rows before it is versioned, with a user column added by a fast default
    before versioning (``note``) and one after (``score``, on both tables, as an operator would
    add it)."""
    conn.execute(f'CREATE TABLE "{name}" (id bigint PRIMARY KEY, name text, qty bigint)')
    conn.execute(f"INSERT INTO \"{name}\" SELECT g, 'n' || g, g FROM generate_series(1000, 1019) g")
    conn.execute(f"ALTER TABLE \"{name}\" ADD COLUMN note text DEFAULT 'old'")
    enable_versioning(conn, name)
    for t in (name, f"{name}_history"):
        conn.execute(f'ALTER TABLE "{t}" ADD COLUMN score bigint DEFAULT 5')
    return {
        i: {"id": i, "name": f"n{i}", "qty": i, "note": "old", "score": 5}
        for i in range(1000, 1020)
    }


# Each step: SQL on the table, and the same change applied to the model.
def _update(m: Rows) -> None:
    for i, r in m.items():
        if i < 1010:
            r["qty"] += 1


def _delete_some(m: Rows) -> None:
    for i in [i for i in m if i < 1003]:
        del m[i]


def _update_key(m: Rows) -> None:
    for i in sorted([i for i in m if i >= 1015], reverse=True):
        m[i + 100] = {**m.pop(i), "id": i + 100}


def _upsert(m: Rows) -> None:
    m[1005] = {**m[1005], "name": "up", "qty": 0}
    m[2000] = {"id": 2000, "name": "new", "qty": 1, "note": "old", "score": 5}


STEPS: list[tuple[str, Callable[[Rows], None]]] = [
    ("UPDATE {t} SET qty = qty + 1 WHERE id < 1010", _update),
    ("DELETE FROM {t} WHERE id < 1003", _delete_some),
    ("UPDATE {t} SET id = id + 100 WHERE id >= 1015", _update_key),
    (
        "INSERT INTO {t} (id, name, qty) VALUES (1005, 'up', 0), (2000, 'new', 1) "
        "ON CONFLICT (id) DO UPDATE SET name = excluded.name, qty = excluded.qty",
        _upsert,
    ),
    ("DELETE FROM {t}", lambda m: m.clear()),
]


def read_at(client: HarnessClient, table: str, as_of: str) -> list[dict[str, Any]]:
    version = client.commit(table, updates=[{"source": "pg", "state": {"as_of": as_of}}])
    return client.read(table, version=version).sort_by("id").to_pylist()


def harness_table(
    client: HarnessClient, dsn: str, pg_table: str, as_of: str, columns: int = len(SCHEMA)
) -> str:
    name = f"h_{uuid.uuid4().hex[:8]}"
    client.create_table(name, SCHEMA[:columns])
    client.add_source(name, "pg", "postgres", config={"dsn": dsn, "table": pg_table},
                      state={"as_of": as_of})  # fmt: skip
    return name


def check_history(conn: psycopg.Connection, pg_table: str) -> None:
    """Every history row has a closed, non-empty period and kept the fast-default values."""
    bad = conn.execute(
        f'SELECT count(*) FROM "{pg_table}_history" WHERE upper_inf(sys_period) '
        "OR isempty(sys_period) OR note IS DISTINCT FROM 'old' OR score IS DISTINCT FROM 5"
    ).fetchone()[0]
    assert bad == 0


def test_multi_row_statements_one_at_a_time(client: HarnessClient, server_dsn: str) -> None:
    pg_table = f"crash_{uuid.uuid4().hex[:8]}"
    with server_survives(server_dsn), psycopg.connect(server_dsn, autocommit=True) as conn:
        model = table_with_old_rows(conn, pg_table)
        table = harness_table(client, server_dsn, pg_table, server_now(conn))
        expected = [snapshot(model)]
        instants = [server_now(conn)]
        for sql, change in STEPS:
            conn.execute(sql.format(t=f'"{pg_table}"'))
            change(model)
            expected.append(snapshot(model))
            instants.append(server_now(conn))
        check_history(conn, pg_table)
    # 10 rows updated, 3 deleted, 5 re-keyed, 1 upserted, 18 deleted: one history row each
    with psycopg.connect(server_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{pg_table}_history"').fetchone()[0] == 37
    for as_of, rows in zip(instants, expected, strict=True):
        assert read_at(client, table, as_of) == rows


def test_multi_row_statements_in_one_transaction(client: HarnessClient, server_dsn: str) -> None:
    pg_table = f"crash_{uuid.uuid4().hex[:8]}"
    with server_survives(server_dsn), psycopg.connect(server_dsn, autocommit=True) as conn:
        model = table_with_old_rows(conn, pg_table)
        before = snapshot(model)
        table = harness_table(client, server_dsn, pg_table, server_now(conn))
        t0 = server_now(conn)
        with conn.transaction():
            for sql, _change in STEPS[:-1]:
                conn.execute(sql.format(t=f'"{pg_table}"'))
        t1 = server_now(conn)
        for _sql, change in STEPS[:-1]:
            change(model)
        after = snapshot(model)
        with conn.transaction():  # a row changed twice in one transaction leaves one entry
            conn.execute(f'UPDATE "{pg_table}" SET qty = -1')
            conn.execute(f'DELETE FROM "{pg_table}"')
        t2 = server_now(conn)
        check_history(conn, pg_table)
        history = conn.execute(f'SELECT count(*) FROM "{pg_table}_history"').fetchone()[0]
    # each original row the first transaction touched once (10 updated, 5 re-keyed; the rows it
    # deleted or upserted were updated first), then every row of t1 once
    assert history == 15 + len(after)
    assert read_at(client, table, t0) == before
    assert read_at(client, table, t1) == after
    assert read_at(client, table, t2) == []


# What releases before VERSION_MARK installed (kept here to test the in-place upgrade).
_OLD_FUNCTION = """
CREATE OR REPLACE FUNCTION public.harness_versioning() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND lower(OLD.sys_period) < now() THEN
        OLD.sys_period := tstzrange(lower(OLD.sys_period), now(), '[)');
        EXECUTE format('INSERT INTO %s SELECT ($1).*', TG_ARGV[0]) USING OLD;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    NEW.sys_period := tstzrange(now(), NULL, '[)');
    RETURN NEW;
END
$fn$;
COMMENT ON FUNCTION public.harness_versioning() IS NULL;
"""


def old_release_table(conn: psycopg.Connection, name: str) -> None:
    """A table versioned the way older releases did it (rows written after ``sys_period`` was
    added, so the old function still worked on them)."""
    conn.execute(f'CREATE TABLE "{name}" (id bigint PRIMARY KEY, name text, qty bigint)')
    conn.execute(
        f'ALTER TABLE "{name}" ADD COLUMN sys_period tstzrange NOT NULL '
        "DEFAULT tstzrange(now(), NULL, '[)')"
    )
    conn.execute(f'CREATE TABLE "{name}_history" (LIKE "{name}")')
    conn.execute(_OLD_FUNCTION)
    conn.execute(
        f'CREATE TRIGGER harness_versioning BEFORE INSERT OR UPDATE OR DELETE ON "{name}" '
        f"FOR EACH ROW EXECUTE FUNCTION public.harness_versioning('public.\"{name}_history\"')"
    )


@pytest.mark.parametrize("how", ["upgrade-versioning", "doput", "maintain"])
def test_older_installation_is_upgraded_in_place(
    client: HarnessClient, server_dsn: str, how: str, gateway: Any
) -> None:
    pg_table = f"old_{uuid.uuid4().hex[:8]}"
    with server_survives(server_dsn), psycopg.connect(server_dsn, autocommit=True) as conn:
        old_release_table(conn, pg_table)
        conn.execute(
            f"INSERT INTO \"{pg_table}\" SELECT g, 'n' || g, g FROM generate_series(1, 10) g"
        )
        table = harness_table(client, server_dsn, pg_table, server_now(conn), columns=3)
        conn.execute(f'UPDATE "{pg_table}" SET qty = 0 WHERE id <= 5')  # old function, full rows
        t1 = server_now(conn)
        assert "public" in outdated_schemas(conn)
        if how == "upgrade-versioning":  # the operator's command
            root = Path(__file__).resolve().parents[2]
            cmd = ["postgres", "upgrade-versioning", server_dsn]
            out = subprocess.run([sys.executable, "-m", "flight_gateway.cli", *cmd],
                                 env={**os.environ, "PYTHONPATH": str(root)},
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
            assert out.returncode == 0, out.stderr
            assert out.stdout.startswith("versioning upgraded to") and pg_table in out.stdout
            assert upgrade_versioning(conn) == []  # idempotent
        elif how == "doput":
            client.put(table, pa.table({"id": [11], "name": ["put"], "qty": [11]}))
        else:
            from flight_gateway.core.maintenance import run_once

            _server, catalog = gateway
            report = run_once(catalog, grace_s=3600)
            assert any(pg_table in t for t in report.upgraded)
        assert outdated_schemas(conn) == []
        comment = conn.execute(
            "SELECT obj_description('public.harness_versioning()'::regprocedure, 'pg_proc')"
        ).fetchone()[0]
        assert comment == VERSION_MARK
        # The crash pattern, now harmless: a fast-default column, then multi-row statements.
        for t in (pg_table, f"{pg_table}_history"):
            conn.execute(f"ALTER TABLE \"{t}\" ADD COLUMN note text DEFAULT 'old'")
            conn.execute(f'ALTER TABLE "{t}" ADD COLUMN score bigint DEFAULT 5')
        conn.execute(f'UPDATE "{pg_table}" SET qty = qty + 100')
        t2 = server_now(conn)
        conn.execute(f'DELETE FROM "{pg_table}" WHERE id > 3')
        t3 = server_now(conn)
        check_history(conn, pg_table)
    extra = [{"id": 11, "name": "put", "qty": 11}] if how == "doput" else []
    v1 = [{"id": i, "name": f"n{i}", "qty": 0 if i <= 5 else i} for i in range(1, 11)]
    v2 = [{**r, "qty": r["qty"] + 100} for r in v1 + extra]
    for as_of, rows in ((t1, v1), (t2, v2), (t3, v2[:3])):
        assert read_at(client, table, as_of) == rows


def test_installed_plpgsql_never_assigns_to_rows_it_did_not_form() -> None:
    """The review of issue 20 as a guard: no function the harness installs (in a user's database
    or in its catalog) assigns to ``OLD`` or to a field of a record variable; trigger functions
    assign only to ``NEW`` fields."""
    from flight_gateway.catalog import pg_functions as postgres_sql
    from planners.postgres import versioning

    for text in (versioning._FUNCTION, postgres_sql.COMMIT_FUNCTION_V1,
                 postgres_sql.LOCK_FUNCTION_V1):  # fmt: skip
        fields = re.findall(r"\b(\w+)\.\w+\s*:=", text)
        assert set(fields) <= {"NEW"}, fields
