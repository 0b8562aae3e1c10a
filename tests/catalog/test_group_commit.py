"""Group commit: commits queued behind a busy table apply together, each with its own checks,
version and result (DESIGN.md §12)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from flight_gateway.catalog import Catalog, CommitResult
from flight_gateway.protocol.errors import AlreadyExists, Conflict, InvalidArgument, NotFound
from tests.catalog.helpers import table_row_held, wait_groups, wait_queued


@pytest.fixture
def table(catalog: Catalog) -> Catalog:
    catalog.create_table(
        "t", [{"name": "id", "type": "int64"}, {"name": "p", "type": "string"}], partition_by=["p"]
    )
    catalog.commit(
        "t",
        "setup",
        add_sources=[{"name": f"s{i}", "kind": "files", "state": {"n": 0}} for i in range(8)],
    )
    return catalog


class _Group:
    """Commits started one by one on their own threads while the table is held, so they queue
    in a known order and are applied as one group when it is released."""

    def __init__(self, cat: Catalog, catalog_url: str) -> None:
        self.cat, self.url = cat, catalog_url
        self.results: dict[str, CommitResult | BaseException] = {}
        self.threads: list[threading.Thread] = []

    def _run(self, name: str, fn: Callable[[], CommitResult]) -> None:
        try:
            self.results[name] = fn()
        except BaseException as e:
            self.results[name] = e

    def start(self, name: str, **commit: Any) -> None:
        cid = commit.pop("commit_id", name)
        th = threading.Thread(
            target=self._run, args=(name, lambda: self.cat.commit("t", cid, **commit))
        )
        th.start()
        self.threads.append(th)

    def run(self, commits: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        stats = self.cat.group_commit_stats()
        assert stats is not None
        with table_row_held(self.url, "t"):
            # The first commit leads a group of its own and blocks on the held table ...
            self.start("blocked", updates=[{"source": "s7", "state": {"n": -1}}])
            wait_groups(self.cat, stats.groups + 1)
            # ... so these queue behind it, in this order, and form the next group.
            for i, (name, kwargs) in enumerate(commits, start=1):
                self.start(name, **kwargs)
                wait_queued(self.cat, "t", i)
        for th in self.threads:
            th.join(60)
        return self.results


def _up(source: str, n: int, expect: int | None = None) -> dict[str, Any]:
    return {"source": source, "state": {"n": n}, "expect_state_version": expect}


def test_one_failing_cas_fails_alone(table: Catalog, catalog_url: str) -> None:
    before = table.describe("t")
    res = _Group(table, catalog_url).run(
        [(f"w{i}", {"updates": [_up(f"s{i}", 1, expect=1 if i != 3 else 7)]}) for i in range(7)]
    )
    stats = table.group_commit_stats()
    assert stats is not None and stats.largest == 7
    assert isinstance(res["w3"], Conflict) and "expected 7" in str(res["w3"])
    ok = [res[f"w{i}"] for i in range(7) if i != 3]
    assert all(isinstance(r, CommitResult) and r.applied for r in ok)
    # Each its own version, in arrival order, gap-free after the blocked leader's.
    assert [r.version for r in ok] == list(range(before.version + 2, before.version + 8))
    after = table.describe("t")
    assert after.version == before.version + 7
    assert after.source("s3") == before.source("s3")
    assert table.find_commit("t", "w3") is None
    assert [h.version for h in table.history("t")] == list(range(after.version, -1, -1))
    for i in (0, 1, 2, 4, 5, 6):
        assert after.source(f"s{i}").state == {"n": 1}
        assert after.source(f"s{i}").state_version == 2


def test_group_members_see_each_other(table: Catalog, catalog_url: str) -> None:
    """Later commits of a group are checked against the effects of earlier ones."""
    res = _Group(table, catalog_url).run(
        [
            ("add", {"add_sources": [{"name": "new", "kind": "files", "partition": {"p": "x"}}]}),
            ("use-new", {"updates": [_up("new", 5, expect=1)]}),
            ("cas-1", {"updates": [_up("s0", 1, expect=1)]}),
            ("cas-2", {"updates": [_up("s0", 2, expect=2)]}),
            ("cas-stale", {"updates": [_up("s0", 3, expect=2)]}),
            ("dup", {"commit_id": "cas-1", "updates": [_up("s0", 9)]}),
            ("rm", {"remove_sources": ["s1"]}),
            ("use-removed", {"updates": [_up("s1", 1)]}),
            ("readd", {"add_sources": [{"name": "s1", "kind": "files", "state": {"n": 100}}]}),
            ("add-again", {"add_sources": [{"name": "new", "kind": "files"}]}),
            ("bad-part", {"add_sources": [{"name": "q", "kind": "files", "partition": {"z": 1}}]}),
            ("missing", {"updates": [_up("s2", 1), _up("nope", 1)], "external_state": {"x": 1}}),
            ("ext", {"external_state": {"offset": 7}, "properties": {"owner": "me"}}),
        ]
    )
    assert isinstance(res["cas-stale"], Conflict)
    assert isinstance(res["use-removed"], NotFound)
    assert isinstance(res["add-again"], AlreadyExists)
    assert isinstance(res["bad-part"], InvalidArgument)
    assert isinstance(res["missing"], NotFound) and "'nope'" in str(res["missing"])
    assert not res["dup"].applied and res["dup"].version == res["cas-1"].version
    good = ["add", "use-new", "cas-1", "cas-2", "rm", "readd", "ext"]
    versions = [res[n].version for n in good]
    assert versions == list(range(versions[0], versions[0] + len(good)))
    snap = table.describe("t")
    assert snap.source("new").state == {"n": 5} and snap.source("new").state_version == 2
    assert snap.source("s0").state == {"n": 2} and snap.source("s0").state_version == 3
    assert snap.source("s1").state == {"n": 100} and snap.source("s1").state_version == 1
    assert snap.source("s2").state == {"n": 0}
    assert snap.external_state == {"offset": 7} and snap.properties == {"owner": "me"}
    assert table.describe("t", version=res["rm"].version).source("s0").state == {"n": 2}
    assert [s.name for s in table.describe("t", version=res["rm"].version).sources].count("s1") == 0


def test_schema_change_in_a_group(table: Catalog, catalog_url: str) -> None:
    res = _Group(table, catalog_url).run(
        [
            ("before", {"updates": [_up("s0", 1)]}),
            ("evolve", {"schema_changes": [{"op": "add_column", "name": "m", "type": "string"}]}),
            ("bad-evolve", {"schema_changes": [{"op": "drop_column", "name": "nope"}]}),
            (
                "evolve-2",
                {"schema_changes": [{"op": "rename_column", "name": "m", "new_name": "k"}]},
            ),
            ("after", {"updates": [_up("s0", 2, expect=2)]}),
        ]
    )
    assert isinstance(res["bad-evolve"], InvalidArgument)
    assert [res[n].schema_id for n in ("before", "evolve", "evolve-2", "after")] == [0, 1, 2, 2]
    assert table.describe("t", version=res["evolve"].version).schema.names[-1] == "m"
    assert table.describe("t").schema.field("k").id == 3
    assert table.describe("t").source("s0").state == {"n": 2}


def test_commits_without_group_commit(catalog_url: str) -> None:
    with Catalog(catalog_url, group_commit=False) as cat:
        cat.create_table("t", [{"name": "id", "type": "int64"}])
        assert cat.commit("t", "a", add_sources=[{"name": "s", "kind": "files"}]).version == 1
        assert cat.group_commit_stats() is None
