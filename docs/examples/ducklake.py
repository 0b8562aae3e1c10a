"""Basement dweller example: the medium example with DuckLake instead of Iceberg, and the
harness catalog, the DuckLake metadata and the hot table all in one Postgres database.
"""

from __future__ import annotations

import logging

import psycopg
import pyarrow as pa
from _env import environment

from pipelines.mover import Mover
from planners.ducklake import connect
from planners.postgres.versioning import enable_versioning, server_now

log = logging.getLogger("ducklake")
SCHEMA = pa.schema([("id", pa.int64()), ("msg", pa.string())])

with environment(catalog_in_postgres=True) as probe:  # catalog, lake metadata, hot table: one DB
    dsn = probe.pg_dsn
    import os
    from urllib.parse import urlparse

    u = urlparse(dsn)
    lake_cfg = {
        "metadata": f"postgres:dbname={u.path.lstrip('/')} host={u.hostname} port={u.port or 5432} user={u.username or 'postgres'}",
        "data_path": f"{probe.root / 'lake'}/",
        "table": "logs_cold",
    }
    os.makedirs(lake_cfg["data_path"], exist_ok=True)
    c = probe.client
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE logs (id bigint PRIMARY KEY, msg text)")
        enable_versioning(conn, "logs")
        conn.execute("INSERT INTO logs SELECT g, 'log ' || g FROM generate_series(1, 50) g")
        as_of = server_now(conn)
    con = connect(lake_cfg, read_only=False)
    con.execute("CREATE TABLE lake.logs_cold (id BIGINT, msg VARCHAR)")
    lake_snapshot = con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0]
    con.close()
    c.create_table("logs", SCHEMA, primary_key=["id"])
    c.commit(
        "logs",
        add_sources=[
            {
                "name": "postgres",
                "kind": "postgres",
                "config": {"dsn": dsn, "table": "logs"},
                "state": {"as_of": as_of},
            },
            {
                "name": "ducklake",
                "kind": "ducklake",
                "config": lake_cfg,
                "state": {"snapshot_id": lake_snapshot},
            },
        ],
    )
    before = c.describe("logs").version
    mover = Mover(c, "logs", "postgres", "ducklake")
    result = mover.run_once()
    assert sorted(c.read("logs", columns=["id"]).column("id").to_pylist()) == list(range(1, 51))
    assert sorted(c.read("logs", version=before, columns=["id"]).column("id").to_pylist()) == list(
        range(1, 51)
    )
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM logs").fetchone() == (0,)
        lake_tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name LIKE 'ducklake_%'"
        ).fetchone()[0]
        harness_tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name LIKE 'harness_%'"
        ).fetchone()[0]
    assert lake_tables and harness_tables
    log.info(
        "moved %d rows Postgres -> DuckLake in version %d; the hot table, the DuckLake metadata "
        "(%d ducklake_* tables) and the harness catalog (%d harness_* tables) share one Postgres database",
        result.rows,
        result.version,
        lake_tables,
        harness_tables,
    )
    log.info("ducklake example: OK")
