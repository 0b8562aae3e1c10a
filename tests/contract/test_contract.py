"""The contract every source kind keeps, one parametrized suite over every kind (built-in and
plugin): pinned reads are repeatable, filters agree with DuckDB, projection, partition pruning,
schema evolution, idempotent appends, streaming exactly once, bad configs refused at commit.

Capabilities a kind lacks skip their test (e.g. appends for DuckLake); everything else runs."""

from __future__ import annotations

import json
import uuid
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import InvalidArgument
from planners import registry
from planners.kind import Appendable, ReadsDirect, Streams
from tests.contract.kinds import ADAPTERS, ARROW, SCHEMA, Adapter, Env

pytestmark = pytest.mark.integration


def rows(ids: range, names: tuple[str, ...] = ("a", "b", None)) -> pa.Table:  # type: ignore[assignment]
    return pa.table(
        {
            "id": list(ids),
            "name": [names[i % len(names)] for i in ids],
            "amount": [None if i % 7 == 3 else i * 1.5 for i in ids],
        },
        schema=ARROW,
    )


class Harness:
    """One harness table over sources of the kind under test."""

    def __init__(self, adapter: Adapter, env: Env, client: HarnessClient) -> None:
        self.adapter, self.env, self.client = adapter, env, client
        self.configs: dict[str, dict[str, Any]] = {}

    def add(self, name: str, partition: dict[str, Any] | None = None) -> None:
        config, state = self.adapter.create(self.env, name)
        self.configs[name] = config
        self.client.add_source(
            "t", name, self.adapter.kind, config=config, state=state, partition=partition
        )

    def write(self, name: str, data: pa.Table) -> int:
        state = self.client.describe("t").source(name).state
        new = self.adapter.write(self.env, self.configs[name], state, data)
        return self.client.commit("t", updates=[{"source": name, "state": new}])

    def ids(self, **read: Any) -> list[int]:
        return sorted(self.client.read("t", **read).column("id").to_pylist())


@pytest.fixture(params=sorted(ADAPTERS))
def harness(request: pytest.FixtureRequest, client: HarnessClient, tmp_path) -> Harness:
    adapter = ADAPTERS[request.param]
    for need in adapter.needs:
        request.getfixturevalue(need)
    return Harness(adapter, Env(tmp_path, request.getfixturevalue), client)


def _table(h: Harness, **kw: Any) -> None:
    h.client.create_table("t", SCHEMA, **kw)


def test_pinned_reads_are_repeatable(harness: Harness) -> None:
    _table(harness)
    harness.add("s")
    v1 = harness.write("s", rows(range(0, 20)))
    v2 = harness.write("s", rows(range(20, 30)))
    assert harness.ids(version=v1) == list(range(20))
    assert harness.ids(version=v2) == list(range(30))
    assert harness.ids(version=v1) == list(range(20))  # again, after newer writes


FILTERS = [
    "id >= 5 AND id < 17",
    "name = 'a' OR amount > 30",
    "NOT (name = 'b') AND amount IS NOT NULL",
    "name IS NULL",
    "id IN (1, 3, 5, 40) AND NOT amount BETWEEN 2 AND 5",
    "name LIKE 'a%' OR id = 2",
    "amount <> 4.5",
]


@pytest.mark.parametrize("flt", FILTERS)
def test_filters_agree_with_duckdb(harness: Harness, flt: str) -> None:
    _table(harness)
    harness.add("s")
    data = rows(range(0, 40))
    harness.write("s", data)
    con = duckdb.connect()
    con.register("data", data)
    expected = sorted(r[0] for r in con.execute(f"SELECT id FROM data WHERE {flt}").fetchall())
    assert harness.ids(filter=flt) == expected


def test_projection_in_requested_order(harness: Harness) -> None:
    _table(harness)
    harness.add("s")
    harness.write("s", rows(range(0, 6)))
    got = harness.client.read("t", columns=["amount", "id"])
    assert got.column_names == ["amount", "id"]
    assert got.sort_by("id").to_pydict() == rows(range(0, 6)).select(["amount", "id"]).to_pydict()


def test_partition_pruning(harness: Harness) -> None:
    _table(harness, partition_by=["name"])
    harness.add("pa", {"name": "a"})
    harness.add("pb", {"name": "b"})
    harness.write("pa", rows(range(0, 4), ("a",)))
    harness.write("pb", rows(range(4, 8), ("b",)))
    info = harness.client.flight_info("t", filter="name = 'b'")
    pruned = {s["name"]: s["pruned"] for s in json.loads(info.app_metadata)["sources"]}
    assert pruned == {"pa": True, "pb": False}
    assert harness.ids(filter="name = 'b'") == [4, 5, 6, 7]


def test_schema_evolution(harness: Harness) -> None:
    _table(harness)
    harness.add("s")
    v1 = harness.write("s", rows(range(0, 5)))
    harness.client.evolve_schema("t", [{"op": "add_column", "name": "extra", "type": "int64"}])
    newer = rows(range(5, 8)).append_column("extra", pa.array([7, 8, 9], pa.int64()))
    harness.write("s", newer)
    assert harness.client.read("t", version=v1).column_names == ["id", "name", "amount"]
    latest = harness.client.read("t").sort_by("id")
    assert latest.column("extra").to_pylist() == [None] * 5 + [7, 8, 9]


def test_idempotent_append(harness: Harness) -> None:
    kind = registry.get_kind(harness.adapter.kind)
    if not isinstance(kind, Appendable) or "append" in harness.adapter.lacks:
        pytest.skip(f"{harness.adapter.name or harness.adapter.kind} does not accept appends")
    _table(harness)
    harness.add("s")
    commit = uuid.uuid4().hex
    first = harness.client.put("t", rows(range(0, 5)), commit_id=commit)
    again = harness.client.put("t", rows(range(0, 5)), commit_id=commit)
    assert (first["applied"], again["applied"], again["version"]) == (True, False, first["version"])
    harness.client.put("t", rows(range(5, 9)))
    assert harness.ids() == list(range(9))


def test_streaming_delivers_each_row_once(harness: Harness) -> None:
    if not isinstance(registry.get_kind(harness.adapter.kind), Streams):
        pytest.skip(f"{harness.adapter.kind} does not report added rows")
    _table(harness)
    harness.add("s")
    seen: list[int] = []
    last = harness.client.describe("t").version
    for batch in (range(0, 4), range(4, 10), range(10, 11)):
        version = harness.write("s", rows(batch))
        info = harness.client.flight_info("t", version=version, since=last)
        parts = [harness.client.read_endpoint(ep).read_all() for ep in info.endpoints]
        seen += [i for p in parts for i in p.column("id").to_pylist()]
        last = version
    assert sorted(seen) == list(range(11))


def test_bad_config_is_refused_at_commit(harness: Harness) -> None:
    _table(harness)
    version = harness.client.describe("t").version
    with pytest.raises(InvalidArgument, match="source 'bad'"):
        harness.client.add_source(
            "t", "bad", harness.adapter.kind, config=harness.adapter.bad_config()
        )
    assert harness.client.describe("t").version == version


def test_direct_reads_equal_flight_reads(harness: Harness) -> None:
    kind = registry.get_kind(harness.adapter.kind)
    if not isinstance(kind, ReadsDirect) or "direct" in harness.adapter.lacks:
        pytest.skip(f"{harness.adapter.name or harness.adapter.kind} has no direct tasks")
    _table(harness)
    config, state = harness.adapter.create(harness.env, "s")
    harness.configs["s"] = config
    harness.client.add_source(
        "t", "s", harness.adapter.kind, config={**config, "direct": True}, state=state
    )
    v1 = harness.write("s", rows(range(0, 20)))
    harness.write("s", rows(range(20, 30)))
    for read in ({}, {"version": v1}, {"filter": FILTERS[1], "columns": ["amount", "id"]}):
        info = harness.client.flight_info("t", direct=True, **read)
        assert all(harness.client.direct_task(ep) for ep in info.endpoints)
        flight = harness.client.read("t", **read).sort_by("id")
        assert harness.client.read("t", direct=True, **read).sort_by("id").equals(flight)


def test_sql_engine_reads_equal_flight_reads(harness: Harness) -> None:
    """Flight SQL: a kind that ``ScansInEngine`` is scanned by DuckDB itself, the others
    through the harness stream; either way the rows equal the Flight read, at a pinned version,
    with a filter, and after columns were added and renamed."""
    import adbc_driver_flightsql.dbapi as flightsql

    _table(harness)
    harness.add("s")
    v1 = harness.write("s", rows(range(0, 20)))
    harness.client.evolve_schema("t", [{"op": "add_column", "name": "extra", "type": "int64"}])
    newer = rows(range(20, 30)).append_column("extra", pa.array(range(10), pa.int64()))
    harness.write("s", newer)
    harness.client.evolve_schema(
        "t", [{"op": "rename_column", "name": "name", "new_name": "label"}]
    )
    statements = {
        f"SELECT id, name, amount FROM t FOR VERSION AS OF {v1}": {"version": v1},
        "SELECT id, label, amount, extra FROM t": {},
        f"SELECT id, amount FROM t WHERE {FILTERS[1].replace('name', 'label')}": {
            "filter": FILTERS[1].replace("name", "label"),
            "columns": ["id", "amount"],
        },
    }
    with flightsql.connect(harness.client.uri, autocommit=True) as conn, conn.cursor() as cur:
        for sql, read in statements.items():
            cur.execute(sql + " ORDER BY id")
            got = cur.fetch_arrow_table()
            want = harness.client.read("t", **read).sort_by("id")
            assert got.to_pylist() == want.select(got.column_names).to_pylist(), sql
