"""Property: for random data and random filters, gateway result == DuckDB filtering the same rows."""

from __future__ import annotations

import datetime as dt
import uuid

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.helpers import DuckLakeFixture, client_for, running_gateway, write_parquet

ARROW = pa.schema(
    [
        ("id", pa.int64()),
        ("n", pa.int32()),
        ("s", pa.string()),
        ("x", pa.float64()),
        ("d", pa.date32()),
    ]
)
SCHEMA = [{"name": f.name, "type": str(f.type)} for f in ARROW]

ints = st.integers(-3, 3)
strs = st.sampled_from(["", "a", "ab", "abc", "b", "ba"])
floats = st.sampled_from([-1.5, 0.0, 0.5, 2.0])
dates = st.dates(dt.date(2024, 1, 1), dt.date(2024, 1, 5))

row = st.fixed_dictionaries(
    {"n": st.none() | ints, "s": st.none() | strs, "x": st.none() | floats, "d": st.none() | dates}
)


def lit(col: str, draw_value: object) -> str:
    if draw_value is None:
        return "NULL"
    if col == "s":
        return f"'{draw_value}'"
    if col == "d":
        return f"DATE '{draw_value}'"
    return repr(draw_value)


values = {"n": ints, "s": strs, "x": floats, "d": dates}


@st.composite
def atom(draw: st.DrawFn) -> str:
    col = draw(st.sampled_from(["n", "s", "x", "d"]))
    v = values[col]
    kind = draw(st.sampled_from(["cmp", "in", "between", "null", "like", "const"]))
    if kind == "cmp":
        op = draw(st.sampled_from(["=", "!=", "<>", "<", "<=", ">", ">="]))
        if draw(st.booleans()):
            return f"{col} {op} {lit(col, draw(v))}"
        return f"{lit(col, draw(v))} {op} {col}"  # literal on the left
    if kind == "in":
        items = draw(st.lists(st.none() | v, min_size=1, max_size=3))
        neg = "NOT " if draw(st.booleans()) else ""
        return f"{col} {neg}IN ({', '.join(lit(col, i) for i in items)})"
    if kind == "between":
        neg = "NOT " if draw(st.booleans()) else ""
        return f"{col} {neg}BETWEEN {lit(col, draw(v))} AND {lit(col, draw(v))}"
    if kind == "null":
        return f"{col} IS {'NOT ' if draw(st.booleans()) else ''}NULL"
    if kind == "like":
        neg = "NOT " if draw(st.booleans()) else ""
        return f"s {neg}LIKE '{draw(strs)}%'"
    return draw(st.sampled_from(["TRUE", "FALSE"]))


# Mostly shallow: deep trees mask NULL-handling differences behind AND/OR.
filters = atom() | st.recursive(
    atom(),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda t: f"({t[0]} AND {t[1]})"),
        st.tuples(inner, inner).map(lambda t: f"({t[0]} OR {t[1]})"),
        inner.map(lambda e: f"NOT ({e})"),
    ),
    max_leaves=4,
)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("prop")
    with running_gateway(f"sqlite:///{root / 'catalog.db'}") as (server, _):
        client = client_for(server)
        yield root, client, DuckLakeFixture(root / "lake")
        client.close()


@pytest.mark.slow
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    data=st.lists(row, min_size=0, max_size=24),
    flts=st.lists(filters, min_size=1, max_size=12),
    split=st.integers(0, 24),
)
def test_gateway_filter_equals_duckdb(env, data: list[dict], flts: list[str], split: int) -> None:
    root, client, lake = env
    name = f"t{uuid.uuid4().hex[:10]}"
    table = pa.Table.from_pylist([{"id": i, **r} for i, r in enumerate(data)], schema=ARROW)
    split = min(split, table.num_rows)
    file_part, lake_part = table.slice(0, split), table.slice(split)
    write_parquet(root / f"{name}.parquet", file_part)
    snap = _ducklake_insert(lake, name, lake_part)
    client.create_table(name, SCHEMA)
    client.commit(
        name,
        add_sources=[
            {
                "name": "files",
                "kind": "files",
                "config": {"root": str(root)},
                "state": {"files": [f"{name}.parquet"]},
            },
            {
                "name": "lake",
                "kind": "ducklake",
                "config": lake.source_config(name),
                "state": {"snapshot_id": snap},
            },
        ],
    )
    con = duckdb.connect()
    con.register("data", table)
    for flt in flts:  # set-up is the costly part: check many filters per data set
        got = sorted(client.read(name, columns=["id"], filter=flt).column("id").to_pylist())
        want = sorted(r[0] for r in con.execute(f"SELECT id FROM data WHERE {flt}").fetchall())
        assert got == want, flt


def _ducklake_insert(lake: DuckLakeFixture, name: str, part: pa.Table) -> int:
    from planners.ducklake import connect

    con = connect(lake.config, read_only=False)
    try:
        con.execute(f"CREATE TABLE lake.{name} (id BIGINT, n INTEGER, s VARCHAR, x DOUBLE, d DATE)")
        if part.num_rows:
            con.register("part", part)
            con.execute(f"INSERT INTO lake.{name} SELECT * FROM part")
        return int(con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0])
    finally:
        con.close()
