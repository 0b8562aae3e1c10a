"""A harness string column over a PostgreSQL column of any type reads PostgreSQL's own text of
each value (the oracle: the server's ``::text`` through psycopg). The ADBC driver sends types it
does not decode (inet, tsvector, ranges, points, bit strings, time with time zone) as their
binary wire form, and a cast to string passed those bytes on as if they were text; uuid came as
its 16 bytes, money in cents, intervals and arrays not at all."""

from __future__ import annotations

import psycopg
import pytest

from clients import HarnessClient
from tests.gateway.helpers import versioned_table

pytestmark = pytest.mark.integration

#: (PostgreSQL type, two values as SQL)
TYPES = [
    ("inet", "'10.1.2.3'::inet", "'::1/128'::inet"),
    ("tsvector", "'a fat cat'::tsvector", "''::tsvector"),
    ("int4range", "int4range(1, 5)", "'empty'::int4range"),
    ("point", "point(1.5, -2)", "point(0, 0)"),
    ("bit(3)", "B'101'", "B'000'"),
    ("timetz", "'10:00:01+02'::timetz", "'23:59:59.5-05:30'::timetz"),
    ("uuid", "'5f135877-cf7e-474e-82ec-20b40fb27175'::uuid", "gen_random_uuid()"),
    ("money", "'1.5'::money", "'-1234.56'::money"),
    ("interval", "'1 day 02:03:04'::interval", "'-3 months'::interval"),
    ("integer[]", "ARRAY[1, NULL, 3]", "'{}'::integer[]"),
    ("mood", "'sad'::mood", "'ok'::mood"),  # an enum (USER-DEFINED)
    ("stamp", "'2020-01-02 03:04:05+00'", "'1999-12-31 23:59:59.5+00'"),  # a domain: as its base
    # decoded by the driver and cast as before: text as it is, char(n) with its padding
    ("text", "'plain'", "''"),
    ("char(4)", "'ab'", "'abcd'"),
    ("bpchar", "'ab  '", "'abcd'"),
    ("timestamptz", "'2020-01-02 03:04:05+00'", "'1999-12-31 23:59:59.5+00'"),
]
#: Read as before this change: the driver's decoded value cast by Arrow, not PostgreSQL's text.
CAST = {"char(4)", "bpchar", "timestamptz", "stamp"}


@pytest.fixture
def mood(pg_dsn: str) -> str:
    name = "mood"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "DO $$ BEGIN CREATE TYPE mood AS ENUM ('ok', 'sad'); "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
        conn.execute(
            "DO $$ BEGIN CREATE DOMAIN stamp AS timestamptz; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
    return name


@pytest.mark.parametrize(("pg_type", "first", "second"), TYPES, ids=[t[0] for t in TYPES])
def test_a_string_column_reads_postgresqls_text(
    client: HarnessClient, pg_dsn: str, mood: str, pg_type: str, first: str, second: str
) -> None:
    name, as_of = versioned_table(
        pg_dsn,
        "text",
        f"id bigint primary key, v {pg_type}",
        f"VALUES (1, {first}), (2, {second}), (3, NULL)",
    )
    client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "v", "type": "string"}])
    client.add_source(
        "t", "pg", "postgres", config={"dsn": pg_dsn, "table": name}, state={"as_of": as_of}
    )
    got = client.read("t").sort_by("id")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET datestyle = ISO")
        want = conn.execute(f'SELECT id, v::text FROM "{name}" ORDER BY id').fetchall()
    if pg_type in CAST:  # the base type's value as ADBC decodes it, cast by Arrow
        import adbc_driver_postgresql.dbapi as adbc

        with adbc.connect(pg_dsn, autocommit=True) as con, con.cursor() as cur:
            cur.execute(f'SELECT id, v FROM "{name}" ORDER BY id')
            table = cur.fetch_arrow_table()
        want = list(
            zip(
                table.column(0).to_pylist(), table.column(1).cast("string").to_pylist(), strict=True
            )
        )
    assert list(zip(*(c.to_pylist() for c in got.columns), strict=True)) == want
