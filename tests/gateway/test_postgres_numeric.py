"""NUMERIC read from versioned Postgres tables (``planners.postgres.numeric``): a declared
precision up to 18 travels as unscaled 64-bit integers, anything else as text. Every value the
gateway returns is compared with psycopg's ``Decimal`` of the same row, read on its own:
negatives, nulls, zero, the largest and smallest values of each type, scale 0 and scale equal
to the precision; through whole reads, filtered and limited reads, and the pinned-rows cache
extended by rows written later."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import adbc_driver_postgresql.dbapi as adbc
import psycopg
import pyarrow as pa
import pytest

from clients import HarnessClient
from flight_gateway.protocol.arrow_types import parse_type
from flight_gateway.protocol.errors import InvalidArgument
from planners.postgres import PostgresConfig, _columns, _output
from planners.postgres.cache import CACHE
from planners.postgres.numeric import decoded, to_decimal, unscaled
from planners.postgres.versioning import server_now
from tests.gateway.helpers import versioned_table

# (column, Postgres type, harness type, values besides NULL)
COLUMNS = [
    ("a", "numeric(7,2)", "decimal128(7, 2)", ["99999.99", "-99999.99", "0", "0.01", "-0.01"]),
    ("b", "numeric(18,0)", "decimal128(18, 0)",
     ["999999999999999999", "-999999999999999999", "0", "1", "-1"]),
    ("c", "numeric(18,4)", "decimal128(18, 4)",
     ["99999999999999.9999", "-99999999999999.9999", "0", "-0.0001", "12.5"]),
    ("d", "numeric(5)", "decimal128(5, 0)", ["99999", "-99999", "0", "7", "-42"]),
    ("e", "numeric(9,9)", "decimal128(9, 9)", ["0.999999999", "-0.999999999", "0", "-1e-9", "0.5"]),
    ("f", "numeric(20,2)", "decimal128(20, 2)",  # wider than 18: as text
     ["999999999999999999.99", "-999999999999999999.99", "0", "0.01", "-3"]),
    ("g", "numeric", "decimal128(12, 3)", ["123456789.123", "-1.5", "0", "0.001", "-0.001"]),
]  # fmt: skip


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    CACHE.clear()
    yield
    CACHE.clear()


def _rows(start: int) -> list[tuple[Any, ...]]:
    """Five rows of every column's values, then one of nulls only."""
    rows = [(start + i, *(Decimal(values[i]) for _, _, _, values in COLUMNS)) for i in range(5)]
    return [*rows, (start + 5, *([None] * len(COLUMNS)))]


def _insert(dsn: str, name: str, rows: list[tuple[Any, ...]]) -> str:
    marks = ", ".join(["%s"] * (len(COLUMNS) + 1))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.cursor().executemany(f'INSERT INTO "{name}" VALUES ({marks})', rows)
        return server_now(conn)


def _psycopg(dsn: str, name: str) -> dict[int, tuple[Any, ...]]:
    """Every current row, as psycopg reads it (``Decimal`` per NUMERIC)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f'SELECT * FROM "{name}"').fetchall()
    return {r[0]: tuple(r[1 : len(COLUMNS) + 1]) for r in rows}


def _gateway(table: pa.Table) -> dict[int, tuple[Any, ...]]:
    cols = [table.column(c).to_pylist() for c, _, _, _ in COLUMNS]
    return {i: tuple(c[n] for c in cols) for n, i in enumerate(table.column("id").to_pylist())}


def _same(got: dict[int, tuple[Any, ...]], want: dict[int, tuple[Any, ...]]) -> None:
    """The same rows, each value exactly equal and written with the same digits (a numeric
    of scale s as a decimal of scale s); nulls where psycopg has None."""
    assert got.keys() == want.keys()
    for key, row in want.items():
        for (col, pg_type, _, _), mine, theirs in zip(COLUMNS, got[key], row, strict=True):
            assert (mine is None) == (theirs is None), (key, col)
            if theirs is not None:
                assert mine == theirs, (key, col, mine, theirs)
                if pg_type != "numeric":  # a declared scale: the same digits too
                    assert str(mine) == str(theirs), (key, col, mine, theirs)


@pytest.fixture
def numeric_table(client: HarnessClient, pg_dsn: str) -> tuple[str, int]:
    columns = ", ".join(f"{c} {t}" for c, t, _, _ in COLUMNS)
    name, _ = versioned_table(pg_dsn, "numeric", f"id bigint PRIMARY KEY, {columns}")
    as_of = _insert(pg_dsn, name, _rows(0))
    client.create_table(
        "t", [{"name": "id", "type": "int64"}]
        + [{"name": c, "type": h} for c, _, h, _ in COLUMNS],
    )  # fmt: skip
    version = client.add_source("t", "pg", "postgres", config={"dsn": pg_dsn, "table": name},
                                state={"as_of": as_of})  # fmt: skip
    return name, version


@pytest.mark.integration
def test_values_equal_psycopgs(client: HarnessClient, pg_dsn: str, numeric_table) -> None:
    name, version = numeric_table
    got = client.read("t", version=version)
    assert [got.schema.field(c).type for c, _, _, _ in COLUMNS] == [
        parse_type(h) for _, _, h, _ in COLUMNS
    ]
    _same(_gateway(got), _psycopg(pg_dsn, name))
    # Filtered (the filter on the stored values) and limited reads: not through the cache.
    neg = client.read("t", version=version, filter="a < 0")
    assert sorted(neg.column("id").to_pylist()) == [1, 4]
    _same(_gateway(neg), {k: v for k, v in _psycopg(pg_dsn, name).items() if k in (1, 4)})
    limited = client.read("t", version=version, limit=3)
    want = _psycopg(pg_dsn, name)
    _same(_gateway(limited), {k: want[k] for k in limited.column("id").to_pylist()})


@pytest.mark.integration
def test_rows_written_later_extend_the_kept_rows(
    client: HarnessClient, pg_dsn: str, numeric_table
) -> None:
    name, version = numeric_table
    client.read("t", version=version)  # kept
    as_of = _insert(pg_dsn, name, _rows(100))
    newer = client.commit("t", updates=[{"source": "pg", "state": {"as_of": as_of}}])
    got = client.read("t", version=newer)
    assert sum(CACHE.extended.values()) == 1
    _same(_gateway(got), _psycopg(pg_dsn, name))


@pytest.mark.integration
def test_a_history_typed_otherwise_travels_as_text(client: HarnessClient, pg_dsn: str) -> None:
    """A row version in the history table with more decimals than the current table's type
    allows (its column typed otherwise there: the union has no declared precision) is read
    exactly, not rounded to the current table's scale."""
    name, _ = versioned_table(pg_dsn, "numeric", "id bigint PRIMARY KEY, x numeric(7,2)")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'INSERT INTO "{name}" VALUES (1, 1.5), (2, -99999.99)')
        conn.execute(f'ALTER TABLE "{name}_history" ALTER COLUMN x TYPE numeric(9,4)')
        conn.execute(
            f'INSERT INTO "{name}_history" (id, x, sys_period) '
            "VALUES (3, -1.2345, tstzrange(now() - interval '1 day', now() + interval '1 day'))"
        )
        as_of = server_now(conn)
    config = PostgresConfig.parse({"dsn": pg_dsn, "table": name}, where="t")
    with adbc.connect(pg_dsn, autocommit=True) as con, con.cursor() as cur:
        assert _columns(cur, config, "src")["x"] == "numeric"
    client.create_table(
        "t", [{"name": "id", "type": "int64"}, {"name": "x", "type": "decimal128(9, 4)"}]
    )
    version = client.add_source("t", "pg", "postgres", config={"dsn": pg_dsn, "table": name},
                                state={"as_of": as_of})  # fmt: skip
    got = client.read("t", version=version).sort_by("id")
    assert got.column("x").to_pylist() == [Decimal("1.5"), Decimal("-99999.99"),
                                           Decimal("-1.2345")]  # fmt: skip


# ------------------------------------------------------------------ the conversion alone


def test_declared_types_read_as_integers() -> None:
    assert unscaled("numeric(7,2)") == (7, 2)
    assert unscaled("numeric(18,18)") == (18, 18)
    assert unscaled("numeric(5,0)") == (5, 0)
    for other in ("numeric", "numeric(19,2)", "numeric(2,-3)", "numeric(3,5)", "bigint",
                  "numeric(7,2)[]", "ARRAY"):  # fmt: skip
        assert unscaled(other) is None, other
    assert _output("x", "numeric(7,2)") == '(v."x" * 100)::int8 AS "x"'
    assert _output("x", "numeric(5,0)") == 'v."x"::int8 AS "x"'
    assert _output("x", "numeric(20,2)") == 'v."x"::text AS "x"'


def test_to_decimal_keeps_values_nulls_and_offsets() -> None:
    ints = pa.array([0, -1, 1, None, 10**18 - 1, -(10**18) + 1, -12345, None], pa.int64())
    for arr in (ints, ints.slice(1), ints.slice(3, 4)):
        got = to_decimal(arr, 18, 2)
        want = [None if v is None else Decimal(v).scaleb(-2) for v in arr.to_pylist()]
        assert got.type == pa.decimal128(18, 2) and got.to_pylist() == want
        got.validate(full=True)
    assert to_decimal(pa.array([None, None], pa.int64()), 7, 2).null_count == 2
    with pytest.raises(InvalidArgument, match="does not fit"):
        to_decimal(pa.array([100_000], pa.int64()), 5, 2)  # 1000.00 in decimal128(5, 2)


def test_decoded_turns_only_the_named_columns() -> None:
    batch = pa.record_batch({"id": [1, 2], "n": [150, -5], "other": [7, 8]})
    reader = pa.RecordBatchReader.from_batches(batch.schema, [batch])
    out = decoded(reader, {"n": (7, 2), "absent": (5, 0)}).read_all()
    assert out.schema.field("n").type == pa.decimal128(7, 2)
    assert out.column("n").to_pylist() == [Decimal("1.50"), Decimal("-0.05")]
    assert out.column("other").type == pa.int64()


@pytest.mark.integration
def test_a_string_column_gets_postgres_text(client: HarnessClient, pg_dsn: str) -> None:
    """A harness column other than a decimal over numeric(p,s) reads the server's own text
    (Arrow would write 0.000000005 as 5E-9), as before integers travelled."""
    name, _ = versioned_table(pg_dsn, "numeric", "id bigint PRIMARY KEY, x numeric(9,9)")
    as_of = _insert_x(pg_dsn, name, ["0.000000005", "-0.5", "0", None])
    client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "x", "type": "string"}])
    version = client.add_source("t", "pg", "postgres", config={"dsn": pg_dsn, "table": name},
                                state={"as_of": as_of})  # fmt: skip
    got = client.read("t", version=version).sort_by("id").column("x").to_pylist()
    with psycopg.connect(pg_dsn) as conn:
        want = [r[0] for r in conn.execute(f'SELECT x::text FROM "{name}" ORDER BY id')]
    assert got == want == ["0.000000005", "-0.500000000", "0.000000000", None]


def _insert_x(dsn: str, name: str, values: list[str | None]) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.cursor().executemany(
            f'INSERT INTO "{name}" VALUES (%s, %s)',
            [(i, None if v is None else Decimal(v)) for i, v in enumerate(values)],
        )
        return server_now(conn)
