"""Independent readers of the gateway's Iceberg REST face (pyiceberg's RestCatalog, DuckDB's
iceberg extension) and the Iceberg REST OpenAPI spec (apache/iceberg,
``open-api/rest-catalog-open-api.yaml``, Apache 2.0) to check responses against."""

from __future__ import annotations

import functools
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa

SPEC = Path(__file__).with_name("rest-catalog-open-api.yaml")


@functools.cache
def _components() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(SPEC.read_text())["components"]


def check_schema(name: str, body: Any) -> None:
    """``body`` is a valid ``#/components/schemas/<name>`` of the spec (raises otherwise)."""
    from openapi_schema_validator import OAS31Validator

    schema = {"$ref": f"#/components/schemas/{name}", "components": _components()}
    OAS31Validator(schema).validate(body)


def get(url: str, token: str | None = None, method: str = "GET") -> tuple[int, Any]:
    """(status, JSON body) of one request; error statuses are returned, not raised."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            data = resp.read()
            return resp.status, json.loads(data) if data else None
    except urllib.error.HTTPError as e:
        data = e.read()
        return e.code, json.loads(data) if data else None


def rows(t: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted(zip(*(t.column(c).to_pylist() for c in columns), strict=True))


def pyiceberg_catalog(uri: str, token: str | None = None) -> Any:
    from pyiceberg.catalog.rest import RestCatalog

    return RestCatalog("harness", uri=uri, **({"token": token} if token else {}))


def duckdb_rows(
    uri: str, table: str, columns: list[str], token: str | None = None, snapshot: int | None = None
) -> list[tuple[Any, ...]]:
    """The table through DuckDB's iceberg extension attached to the REST endpoint, in a fresh
    connection (its first query on whatever version is current)."""
    import duckdb
    import duckdb_extensions

    con = duckdb.connect(config={"autoinstall_known_extensions": "false"})
    try:
        for name in ("httpfs", "avro", "iceberg"):
            duckdb_extensions.import_extension(name, con=con)
            con.load_extension(name)
        if token:
            con.execute(f"CREATE SECRET harness (TYPE iceberg, TOKEN '{token}')")
            con.execute(f"ATTACH 'harness' AS h (TYPE iceberg, ENDPOINT '{uri}', SECRET harness)")
        else:
            con.execute(
                f"ATTACH 'harness' AS h (TYPE iceberg, ENDPOINT '{uri}', AUTHORIZATION_TYPE 'none')"
            )
        at = f" AT (VERSION => {snapshot})" if snapshot is not None else ""
        cols = ", ".join(columns)
        sql = f"SELECT {cols} FROM h.harness.{table}{at}"
        return sorted(tuple(r) for r in con.execute(sql).fetchall())
    finally:
        con.close()


def versioned_pg_table(dsn: str, values: str, prefix: str = "rest") -> tuple[str, str]:
    """A new system-versioned Postgres table ``(id bigint primary key, region text)`` holding
    ``values`` (an SQL ``INSERT`` tail: ``VALUES ...`` or a ``SELECT``); (its name, the as-of
    instant just after)."""
    import uuid

    import psycopg

    from planners.postgres.versioning import enable_versioning, server_now

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{name}" (id bigint primary key, region text)')
        enable_versioning(conn, name)
        conn.execute(f'INSERT INTO "{name}" {values}')
        return name, server_now(conn)
