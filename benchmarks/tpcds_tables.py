"""The 24 TPC-DS tables (DuckDB's offline ``dsdgen``) spread over five harness source kinds, for
``benchmarks/bench_tpch_sql.py`` and ``tests/flightsql/test_tpcds.py``. Each table lives in one
kind, dealt out by size so that every kind holds fact and dimension tables: Parquet files,
Iceberg, versioned Postgres, Delta and DuckLake (streamed through the harness, not scanned by
the engine). Loading reuses the TPC-H loader (``tpch_tables.load``)."""

from __future__ import annotations

import duckdb

from benchmarks.tpch_tables import generated

KINDS = ("files", "iceberg", "postgres", "delta", "ducklake")


def generate(sf: float) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection holding the TPC-DS tables at scale factor ``sf`` (also the oracle)."""
    return generated("tpcds", f"CALL dsdgen(sf={sf})")


def queries(con: duckdb.DuckDBPyConnection) -> list[tuple[int, str]]:
    rows = con.execute("SELECT query_nr, query FROM tpcds_queries()").fetchall()
    return [(int(n), str(q)) for n, q in rows]


def placement(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[str, ...]]:
    """Table -> (its kind,), the tables dealt to the kinds largest first."""
    tables = [
        str(name)
        for (name,) in con.execute(
            "SELECT table_name FROM duckdb_tables() ORDER BY estimated_size DESC, table_name"
        ).fetchall()
    ]
    return {t: (KINDS[i % len(KINDS)],) for i, t in enumerate(tables)}
