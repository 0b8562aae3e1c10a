"""The columns a Postgres read sees (``planners.postgres._columns``, from pg_catalog) against
information_schema.columns on the same tables, as the oracle: the same columns in the same
order, and the same numeric types (the only types a read treats specially), through domains,
arrays, dropped columns, quoted names and column privileges."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import adbc_driver_postgresql.dbapi as adbc
import psycopg
import pytest

from flight_gateway.protocol.errors import NotFound
from planners.postgres import PostgresConfig, _columns

pytestmark = pytest.mark.integration

ORACLE = (
    "SELECT column_name, CASE WHEN data_type = 'numeric' AND numeric_precision IS NOT NULL "
    "THEN 'numeric(' || numeric_precision || ',' || numeric_scale || ')' ELSE data_type END "
    "FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 "
    "ORDER BY ordinal_position"
)


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[str]:
    name = f"Cols {uuid.uuid4().hex[:6]}"  # a name that needs quoting
    q = f'"{name}"'
    ish = f"numeric_{uuid.uuid4().hex[:6]}"  # a type named like numeric
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {q}")
        conn.execute(f"CREATE DOMAIN {q}.money3 AS numeric(12,3)")
        conn.execute(f"CREATE DOMAIN {q}.label AS text")
        conn.execute(f"CREATE TYPE {q}.mood AS ENUM ('ok', 'sad')")
        # in the search path, so that format_type writes it bare: numeric_...
        conn.execute(f"CREATE TYPE public.{ish} AS ENUM ('x')")
        conn.execute(
            f'CREATE TABLE {q}."wide t" (id bigint PRIMARY KEY, i int, s smallint, n numeric, '
            "n2 numeric(10,2), n40 numeric(40,5), n7 numeric(7), t text, vc varchar(10), "
            "ts timestamptz, ts3 timestamp(3), d date, b bool, f float8, r real, by bytea, "
            f"j jsonb, u uuid, ia int[], na numeric(5,1)[], m {q}.money3, l {q}.label, "
            f'mo {q}.mood, ni {ish}, "odd ""name"" here" numeric(3,0), gone numeric, sys_period tstzrange)'
        )
        conn.execute(f'ALTER TABLE {q}."wide t" DROP COLUMN gone')
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {q} CASCADE")
        conn.execute(f"DROP TYPE public.{ish}")


def _oracle(cur: Any, schema: str, table: str) -> dict[str, str]:
    cur.execute(ORACLE, parameters=(schema, table))
    return {r[0]: r[1] for r in cur.fetchall() if r[0] != "sys_period"}


def _numeric(types: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in types.items() if v.startswith("numeric")}


def test_the_columns_match_information_schema(pg_dsn: str, schema: str) -> None:
    config = PostgresConfig.parse({"dsn": pg_dsn, "schema": schema, "table": "wide t"}, where="t")
    with adbc.connect(pg_dsn, autocommit=True) as con, con.cursor() as cur:
        got = _columns(cur, config, "src")
        want = _oracle(cur, schema, "wide t")
    assert list(got) == list(want)
    assert _numeric(got) == _numeric(want)
    assert _numeric(got) == {
        "n": "numeric",
        "n2": "numeric(10,2)",
        "n40": "numeric(40,5)",
        "n7": "numeric(7,0)",
        "m": "numeric(12,3)",
        'odd "name" here': "numeric(3,0)",
    }  # the numeric array is no numeric: it travels as a list


def test_a_missing_table_is_not_found(pg_dsn: str, schema: str) -> None:
    config = PostgresConfig.parse({"dsn": pg_dsn, "schema": schema, "table": "nope"}, where="t")
    with (
        adbc.connect(pg_dsn, autocommit=True) as con,
        con.cursor() as cur,
        pytest.raises(NotFound, match="does not exist"),
    ):
        _columns(cur, config, "src")


def test_a_role_sees_the_columns_it_may_read(pg_dsn: str, schema: str) -> None:
    role = f"harness_cols_{uuid.uuid4().hex[:8]}"
    q = f'"{schema}"'
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role}")
        conn.execute(f"GRANT USAGE ON SCHEMA {q} TO {role}")
        conn.execute(f'GRANT SELECT (id, n2) ON {q}."wide t" TO {role}')
    config = PostgresConfig.parse({"dsn": pg_dsn, "schema": schema, "table": "wide t"}, where="t")
    try:
        with adbc.connect(pg_dsn, autocommit=True) as con, con.cursor() as cur:
            cur.execute(f"SET ROLE {role}")
            got = _columns(cur, config, "src")
            assert got == _oracle(cur, schema, "wide t") == {"id": "bigint", "n2": "numeric(10,2)"}
            cur.execute("RESET ROLE")
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'REVOKE ALL ON {q}."wide t" FROM {role}')
            conn.execute(f"REVOKE ALL ON SCHEMA {q} FROM {role}")
            conn.execute(f"DROP ROLE {role}")
