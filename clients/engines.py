"""Other engines over harness tables, in process: chDB (ClickHouse) over pinned reads.

``chdb_query(client, "SELECT ... FROM __o__", tables={"o": "orders"})`` reads each harness
table once through the client (projection and filter can be given per table) at its version
when the call starts (or the one given), and runs ClickHouse SQL in which ``__o__`` names the
rows of table ``orders``. DuckDB has ``client.to_duckdb``; Polars has
``clients.polars_scan.scan_harness``; SQL tools use the gateway's Flight SQL endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from clients.client import HarnessClient


def read_pinned(
    client: HarnessClient,
    tables: Mapping[str, str],
    versions: Mapping[str, int] | None = None,
    reads: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, pa.Table]:
    """``{alias: rows}``: every table at its given version, else at its version now."""
    versions = dict(versions or {})
    for table in tables.values():
        versions.setdefault(table, client.describe(table).version)
    return {
        alias: client.read(table, version=versions[table], **dict((reads or {}).get(alias, {})))
        for alias, table in tables.items()
    }


def chdb_query(
    client: HarnessClient,
    sql: str,
    tables: Mapping[str, str],
    *,
    versions: Mapping[str, int] | None = None,
    reads: Mapping[str, Mapping[str, Any]] | None = None,
) -> pa.Table:
    """Run ClickHouse SQL (chDB) in which ``__alias__`` is harness table ``tables[alias]``."""
    import chdb.dataframe as cdf

    frames = read_pinned(client, tables, versions, reads)
    named = {alias: cdf.Table(arrow_table=rows) for alias, rows in frames.items()}
    result = cdf.query(sql=sql, **named)
    return pa.Table.from_pandas(result.to_pandas(), preserve_index=False)
