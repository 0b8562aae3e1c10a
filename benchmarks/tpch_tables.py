"""The eight TPC-H tables (DuckDB's offline ``dbgen``) spread over harness source kinds, shared
by ``benchmarks/bench_tpch_sql.py`` and ``tests/flightsql/test_tpch.py``.

Where each table lives (several kinds per table where it is big enough to matter):

- lineitem: Parquet files, Iceberg, versioned Postgres and Delta, split by ``l_orderkey``;
- orders: Parquet files and versioned Postgres; customer: Iceberg; part: Delta;
- partsupp: Parquet files and Iceberg; supplier: versioned Postgres;
- nation: DuckLake (read through the harness stream, not scanned by the engine; Q7 and Q8 name
  it twice); region: Parquet files.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from clients import HarnessClient

TABLES = ("lineitem", "orders", "customer", "part", "partsupp", "supplier", "nation", "region")
PLACEMENT: dict[str, tuple[str, ...]] = {
    "lineitem": ("files", "iceberg", "postgres", "delta"),
    "orders": ("files", "postgres"),
    "customer": ("iceberg",),
    "part": ("delta",),
    "partsupp": ("files", "iceberg"),
    "supplier": ("postgres",),
    "nation": ("ducklake",),
    "region": ("files",),
}
#: Only kinds DuckDB scans as Parquet: what the engine costs when no source must be streamed
#: or read through a database server.
COLD: dict[str, tuple[str, ...]] = {
    "lineitem": ("files", "iceberg", "delta"),
    "orders": ("files", "iceberg"),
    "customer": ("iceberg",),
    "part": ("delta",),
    "partsupp": ("files", "iceberg"),
    "supplier": ("delta",),
    "nation": ("files",),
    "region": ("files",),
}
#: Rows per Parquet row group in every kind's files: DuckDB's own (the baseline's files), so
#: the ratio compares the same layout; writers' defaults differ (pyiceberg and delta-rs 1 M
#: rows, one row group a thread's unit of work) and would measure the writers, not the gateway.
ROW_GROUP_ROWS = 122_880
#: Primary keys of the tables placed in Postgres (TPC-H's own).
PRIMARY_KEYS = {
    "lineitem": "l_orderkey, l_linenumber",
    "orders": "o_orderkey",
    "supplier": "s_suppkey",
}
KEYS = {
    "lineitem": "l_orderkey",
    "orders": "o_orderkey",
    "partsupp": "ps_partkey",
}


def generated(extension: str, call: str) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the offline ``extension`` (tpch, tpcds) that ran ``call``."""
    import duckdb_extensions

    con = duckdb.connect(config={"autoinstall_known_extensions": "false"})
    duckdb_extensions.import_extension(extension, con=con)
    con.execute(call)
    return con


def generate(sf: float) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection holding the TPC-H tables at scale factor ``sf`` (also the oracle)."""
    return generated("tpch", f"CALL dbgen(sf={sf})")


def queries(con: duckdb.DuckDBPyConnection) -> list[tuple[int, str]]:
    return [(int(n), str(q)) for n, q in con.execute("SELECT * FROM tpch_queries()").fetchall()]


def trino_queries(con: duckdb.DuckDBPyConnection) -> list[tuple[int, str]]:
    """DuckDB's TPC-H text as Trino takes it: qualified by sqlglot against the tables' columns,
    which expands output aliases used in GROUP BY (Q15; Trino resolves none there), and
    without the trailing semicolon."""
    import sqlglot
    from sqlglot.optimizer.qualify import qualify

    schema: dict[str, dict[str, str]] = {}
    for table, column, kind in con.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns"
    ).fetchall():
        schema.setdefault(table, {})[column] = kind
    out = []
    for n, sql in queries(con):
        tree = sqlglot.parse_one(sql.strip().rstrip(";"), read="duckdb")
        out.append(
            (
                n,
                qualify(tree, schema=schema, dialect="duckdb", quote_identifiers=False).sql(
                    "trino"
                ),
            )
        )
    return out


def _split(data: pa.Table, key: str | None, parts: int) -> list[pa.Table]:
    if parts == 1 or key is None:
        return [data]
    data = data.sort_by(key)
    size = -(-data.num_rows // parts)
    return [data.slice(i * size, size) for i in range(parts)]


class Loader:
    """Writes one part of a table into a source of some kind; returns the source spec."""

    def __init__(self, root: Path, dsn: str) -> None:
        self.root, self.dsn = root, dsn
        self.prefix = f"tpch_{uuid.uuid4().hex[:6]}"
        self._iceberg: Any = None

    def files(self, table: str, data: pa.Table) -> dict[str, Any]:
        root = self.root / "files" / table
        root.mkdir(parents=True, exist_ok=True)
        # Decimals as integers, as the baseline's DuckDB, Spark, pyiceberg and delta-rs write
        # them (pyarrow's default, fixed-length bytes, decodes ~1.4x slower in DuckDB).
        pq.write_table(
            data,
            root / "part-0.parquet",
            row_group_size=ROW_GROUP_ROWS,
            store_decimal_as_integer=True,
        )
        return {"config": {"root": str(root)}, "state": {"files": ["part-0.parquet"]}}

    def iceberg(self, table: str, data: pa.Table) -> dict[str, Any]:
        from pyiceberg.catalog.sql import SqlCatalog

        props = {
            "type": "sql",
            "uri": f"sqlite:///{self.root / 'iceberg.db'}",
            "warehouse": f"file://{self.root / 'warehouse'}",
        }
        if self._iceberg is None:
            (self.root / "warehouse").mkdir(parents=True, exist_ok=True)
            self._iceberg = SqlCatalog("default", **{k: v for k, v in props.items() if k != "type"})
            self._iceberg.create_namespace("tpch")
        ice = self._iceberg.create_table(
            f"tpch.{table}",
            schema=data.schema,
            properties={"write.parquet.row-group-limit": str(ROW_GROUP_ROWS)},
        )
        ice.append(data)
        return {
            "config": {"catalog": props, "identifier": f"tpch.{table}"},
            "state": {"snapshot_id": ice.current_snapshot().snapshot_id},
        }

    def postgres(self, table: str, data: pa.Table) -> dict[str, Any]:
        import adbc_driver_postgresql.dbapi as adbc
        import psycopg

        from planners.postgres.versioning import enable_versioning, server_now

        name = f"{self.prefix}_{table}"
        with adbc.connect(self.dsn) as con, con.cursor() as cur:
            cur.adbc_ingest(name, data, mode="create")
            con.commit()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            # ADBC's ingest makes decimal128(p, s) bare NUMERIC; the TPC schemas declare
            # decimal(p, s), as a PostgreSQL schema of theirs would (before versioning: the
            # history table copies the types).
            # One statement: PostgreSQL rewrites the table once, not once per column.
            decimals = [f'ALTER COLUMN "{f.name}" TYPE numeric({f.type.precision}, {f.type.scale})'
                        for f in data.schema if pa.types.is_decimal(f.type)]  # fmt: skip
            if decimals:
                conn.execute(f'ALTER TABLE "{name}" {", ".join(decimals)}')
            if table in PRIMARY_KEYS:
                conn.execute(f'ALTER TABLE "{name}" ADD PRIMARY KEY ({PRIMARY_KEYS[table]})')
            enable_versioning(conn, name)
            conn.execute(f'ANALYZE "{name}"')
            as_of = server_now(conn)
        return {"config": {"dsn": self.dsn, "table": name}, "state": {"as_of": as_of}}

    def delta(self, table: str, data: pa.Table) -> dict[str, Any]:
        from deltalake import DeltaTable, WriterProperties, write_deltalake

        uri = str(self.root / "delta" / table)
        write_deltalake(
            uri, data, writer_properties=WriterProperties(max_row_group_size=ROW_GROUP_ROWS)
        )
        return {"config": {"uri": uri}, "state": {"version": DeltaTable(uri).version()}}

    def ducklake(self, table: str, data: pa.Table) -> dict[str, Any]:
        from planners.ducklake import connect

        config = {
            "metadata": f"sqlite:{self.root / 'lake.sqlite'}",
            "data_path": f"{self.root / 'lake-data'}/",
        }
        con = connect(config, read_only=False)
        try:
            con.register("rows", data)
            con.execute(f"CREATE TABLE lake.{table} AS SELECT * FROM rows")
            snap = con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()
        finally:
            con.close()
        return {"config": {**config, "table": table}, "state": {"snapshot_id": int(snap[0])}}


def load(
    client: HarnessClient,
    oracle: duckdb.DuckDBPyConnection,
    root: Path,
    dsn: str,
    placement: dict[str, tuple[str, ...]] = PLACEMENT,
) -> dict[str, int]:
    """Every table of ``placement`` (TPC-H's by default) in ``oracle`` as a harness table, its
    rows split over the kinds ``placement`` gives it; returns rows per table."""
    loader = Loader(root, dsn)
    rows = {}
    for table in placement:
        data = oracle.execute(f"SELECT * FROM {table}").to_arrow_table()
        rows[table] = data.num_rows
        client.create_table(table, data.schema)
        kinds = placement[table]
        sources = []
        for kind, part in zip(kinds, _split(data, KEYS.get(table), len(kinds)), strict=True):
            write: Callable[[str, pa.Table], dict[str, Any]] = getattr(loader, kind)
            sources.append({"name": kind, "kind": kind, **write(table, part)})
        client.commit(table, add_sources=sources)
    return rows
