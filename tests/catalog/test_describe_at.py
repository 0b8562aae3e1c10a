"""``describe_at`` (how the gateway reads a pinned version: one statement on the pool's DBAPI
connection) answers as the SQLAlchemy path ``describe`` does, version by version, on SQLite and
on Postgres: sources added and removed, states set, key/values set and deleted, the schema
evolved, and the same NOT_FOUND for an expired version, a version past the latest and a table
dropped (or dropped and created again: another incarnation)."""

from __future__ import annotations

import pytest

from flight_gateway.catalog import Catalog
from flight_gateway.protocol.errors import NotFound


def _history(cat: Catalog) -> int:
    """A table whose versions exercise every part of a description; its id."""
    cat.create_table(
        "t", [{"name": "id", "type": "int64"}, {"name": "r", "type": "string"}],
        partition_by=["r"], properties={"owner": "ops"},
    )  # fmt: skip
    cat.commit("t", "c1", add_sources=[
        {"name": n, "kind": "files", "partition": {"r": n}, "config": {"root": f"/d/{n}"},
         "state": {"files": []}} for n in ("a", "b", "c")
    ])  # fmt: skip
    for i in range(12):
        name = "abc"[i % 3]
        cat.commit(
            "t", f"w{i}",
            updates=[{"source": name, "state": {"files": [f"f{j}" for j in range(i)]}}],
            external_state={f"marker.{name}": None if i % 2 else {"intent": i, "s": "é"}},
        )  # fmt: skip
    cat.commit("t", "rm", remove_sources=["b"])
    cat.commit("t", "props", properties={"owner": None, "retention.keep_last": 50})
    cat.evolve_schema("t", "evolve", [{"op": "add_column", "name": "x", "type": "float64"}])
    cat.commit("t", "last", updates=[{"source": "a", "state": {"files": ["z"]}}])
    return cat.head("t").table_id


def test_every_version_as_describe_reads_it(catalog: Catalog) -> None:
    table_id = _history(catalog)
    current = catalog.head("t").current_version
    assert current > 15
    for v in range(current + 1):
        assert catalog.describe_at("t", table_id, v) == catalog.describe("t", version=v), v


def test_not_found_as_describe(catalog: Catalog) -> None:
    table_id = _history(catalog)
    current = catalog.head("t").current_version
    with pytest.raises(NotFound, match="no version"):
        catalog.describe_at("t", table_id, current + 1)
    catalog.expire_versions("t", keep_last=3)
    oldest = catalog.head("t").min_version
    assert oldest > 0
    with pytest.raises(NotFound, match="expired"):
        catalog.describe_at("t", table_id, oldest - 1)
    assert catalog.describe_at("t", table_id, oldest) == catalog.describe("t", version=oldest)
    catalog.drop_table("t")
    with pytest.raises(NotFound, match="dropped"):
        catalog.describe_at("t", table_id, current)
    catalog.create_table("t", [{"name": "id", "type": "int64"}])
    again = catalog.head("t").table_id
    assert again != table_id
    with pytest.raises(NotFound, match="dropped"):
        catalog.describe_at("t", table_id, 0)
    assert catalog.describe_at("t", again, 0) == catalog.describe("t", version=0)


def test_find_commits_in_one_statement(catalog: Catalog) -> None:
    _history(catalog)
    want = {"w3": catalog.find_commit("t", "w3"), "rm": catalog.find_commit("t", "rm")}
    assert all(isinstance(v, int) for v in want.values())
    assert catalog.find_commits("t", ["w3", "nope", "rm", "w3"]) == want
    assert catalog.find_commit("t", "nope") is None
    assert catalog.find_commits("t", []) == {}
    with pytest.raises(NotFound, match="does not exist"):
        catalog.find_commits("missing", ["w3"])
    assert [c.version for c in catalog.history("t") if c.commit_id == "w3"] == [want["w3"]]


def test_head_with_commits_is_head_and_find_commits_in_one_read(catalog: Catalog) -> None:
    _history(catalog)
    head, done = catalog.head_with_commits("t", ["w3", "nope", "rm", "w3"])
    assert head == catalog.head("t")
    assert done == catalog.find_commits("t", ["w3", "nope", "rm"])
    assert catalog.head_with_commits("t", []) == (head, {})
    with pytest.raises(NotFound, match="does not exist"):
        catalog.head_with_commits("missing", ["w3"])
