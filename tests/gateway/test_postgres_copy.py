"""DoPut into versioned Postgres goes through COPY as CSV written by pyarrow: values CSV could
confuse (empty string vs NULL, commas, quotes, newlines, backslashes, unicode, NaN and
infinities, decimals, dates, timestamps) come back exactly; a type CSV cannot carry (a list)
takes the row-by-row path."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import psycopg
import pyarrow as pa
import pytest

from clients import HarnessClient
from planners.postgres.versioning import enable_versioning, server_now

pytestmark = pytest.mark.integration

ROWS = pa.table(
    {
        "id": pa.array([1, 2, 3, 4, 5], pa.int64()),
        "s": ["", None, 'a,"b"\nc', "back\\slash \\N", "ünïcødé ✓"],
        "x": [1.5, float("nan"), float("inf"), -0.0, None],
        "q": pa.array(
            [
                decimal.Decimal("1.50"),
                None,
                decimal.Decimal("-99999.99"),
                decimal.Decimal("0.01"),
                decimal.Decimal("0"),
            ],
            pa.decimal128(7, 2),
        ),
        "d": pa.array(
            [
                dt.date(2020, 1, 1),
                None,
                dt.date(1970, 1, 1),
                dt.date(2099, 12, 31),
                dt.date(2000, 2, 29),
            ]
        ),
        "ts": pa.array(
            [
                dt.datetime(2020, 1, 1, 1, 2, 3, 456789),
                None,
                dt.datetime(1999, 12, 31, 23, 59, 59),
                dt.datetime(2000, 1, 1),
                dt.datetime(2038, 1, 19, 3, 14, 8),
            ],
            pa.timestamp("us", tz="UTC"),
        ),
        "b": [True, None, False, True, False],
    }
)


def test_tricky_values_round_trip(client: HarnessClient, pg_dsn: str) -> None:
    name = f"copy_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{name}" (id bigint, s text, x double precision, q numeric(7, 2), '
            "d date, ts timestamptz, b boolean)"
        )
        enable_versioning(conn, name)
        as_of = server_now(conn)
    client.create_table("t", [{"name": f.name, "type": str(f.type)} for f in ROWS.schema])
    client.add_source("t", "pg", "postgres", config={"dsn": pg_dsn, "table": name}, state={"as_of": as_of})  # fmt: skip
    client.put("t", ROWS)
    got = client.read("t").sort_by("id")
    for col in ROWS.column_names:
        want, have = ROWS.column(col).to_pylist(), got.column(col).to_pylist()
        if col == "x":  # NaN != NaN
            assert [repr(v) for v in have] == [repr(v) for v in want]
        else:
            assert have == want, col


def test_types_csv_cannot_carry_take_the_row_path(client: HarnessClient, pg_dsn: str) -> None:
    name = f"copy_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{name}" (id bigint, tags bigint[])')
        enable_versioning(conn, name)
        as_of = server_now(conn)
    client.create_table("l", [{"name": "id", "type": "int64"}, {"name": "tags", "type": "list<item: int64>"}])  # fmt: skip
    client.add_source("l", "pg", "postgres", config={"dsn": pg_dsn, "table": name}, state={"as_of": as_of})  # fmt: skip
    data = pa.table({"id": [1, 2], "tags": pa.array([[1, 2], None], pa.list_(pa.int64()))})
    client.put("l", data)
    assert client.read("l").sort_by("id").to_pylist() == data.to_pylist()
