"""Real sources for gateway tests: Parquet files, pyiceberg tables, DuckLake tables."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from clients import HarnessClient
from flight_gateway.app import GatewayConfig, HarnessFlightServer
from flight_gateway.catalog import Catalog


@contextlib.contextmanager
def running_gateway(
    catalog_url: str, **config: Any
) -> Iterator[tuple[HarnessFlightServer, Catalog]]:
    config.setdefault("allow_anonymous", True)
    config.setdefault("ticket_key", "test-ticket-key-0123456789")
    cat = Catalog(catalog_url)
    server = HarnessFlightServer(cat, GatewayConfig(catalog=catalog_url, port=0, **config))
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield server, cat
    finally:
        server.shutdown()
        thread.join(10)
        cat.close()


def write_parquet(path: Path, table: pa.Table, **kwargs: Any) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **kwargs)
    return str(path)


class IcebergFixture:
    """A pyiceberg SqlCatalog (SQLite) with a file:// warehouse under ``root``."""

    def __init__(self, root: Path) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        (root / "warehouse").mkdir(parents=True, exist_ok=True)
        self.root = root
        self.props = {
            "type": "sql",
            "uri": f"sqlite:///{root / 'iceberg.db'}",
            "warehouse": f"file://{root / 'warehouse'}",
        }
        self.catalog = SqlCatalog("default", **{k: v for k, v in self.props.items() if k != "type"})
        self.catalog.create_namespace_if_not_exists("db")

    def create(self, name: str, schema: pa.Schema) -> Any:
        return self.catalog.create_table(f"db.{name}", schema=schema)

    def source_config(self, name: str) -> dict[str, Any]:
        return {"catalog": self.props, "identifier": f"db.{name}"}


class DuckLakeFixture:
    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.config = {
            "metadata": f"sqlite:{root / 'lake.sqlite'}",
            "data_path": f"{root / 'lake-data'}/",
        }

    def execute(self, *statements: str) -> int:
        """Run statements against the lake; returns the latest snapshot id afterwards."""
        from planners.ducklake import connect

        con = connect(self.config, read_only=False)
        try:
            for s in statements:
                con.execute(s)
            return int(con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0])
        finally:
            con.close()

    def source_config(self, table: str) -> dict[str, Any]:
        return {**self.config, "table": table}


def client_for(
    server: HarnessFlightServer, token: str | None = None, **options: Any
) -> HarnessClient:
    return HarnessClient(f"grpc://127.0.0.1:{server.port}", token=token, **options)


def versioned_table(
    dsn: str, prefix: str, columns: str, fill: str | None = None
) -> tuple[str, str]:
    """A new system-versioned Postgres table ``<prefix>_<random>`` with ``columns`` (SQL),
    optionally filled by ``fill`` (a SELECT for INSERT, ``{t}`` = the quoted table name).
    Returns (table name, the server clock after it was written, as the first ``as_of``)."""
    import uuid

    import psycopg

    from planners.postgres.versioning import enable_versioning, server_now

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{name}" ({columns})')
        enable_versioning(conn, name)
        if fill:
            conn.execute(f'INSERT INTO "{name}" {fill}')
        return name, server_now(conn)
