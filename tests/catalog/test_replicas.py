"""Two catalogs on one database, as two gateway replicas: each groups its own commits, the
catalog's table lock orders their groups."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from flight_gateway.catalog import Catalog
from flight_gateway.protocol.errors import Conflict
from tests.catalog.workers import commit_many_with

THREADS_EACH = 8
COMMITS_EACH = 20


@pytest.mark.slow
def test_two_replicas_group_their_commits(catalog_url: str) -> None:
    with Catalog(catalog_url) as a, Catalog(catalog_url) as b:
        n = 2 * THREADS_EACH
        a.create_table("t", [{"name": "id", "type": "int64"}])
        a.commit(
            "t",
            "setup",
            add_sources=[
                {"name": f"s{i}", "kind": "files", "state": {"high": 0}} for i in range(n)
            ],
        )
        before = [c.group_commit_stats() for c in (a, b)]
        with ThreadPoolExecutor(n) as pool:
            futures = [
                pool.submit(commit_many_with, (a, b)[i % 2], "t", f"s{i}", COMMITS_EACH)
                for i in range(n)
            ]
            produced = sorted(v for f in futures for v in f.result())
        assert produced == list(range(2, n * COMMITS_EACH + 2))
        assert [h.version for h in b.history("t")] == list(range(n * COMMITS_EACH + 1, -1, -1))
        assert {s.name: s.state for s in b.describe("t").sources} == {
            f"s{i}": {"high": COMMITS_EACH} for i in range(n)
        }
        for cat, old in zip((a, b), before, strict=True):
            new = cat.group_commit_stats()
            assert new is not None and old is not None
            commits, groups = new.commits - old.commits, new.groups - old.groups
            assert commits == n // 2 * COMMITS_EACH
            assert groups < commits, "each replica grouped some of its commits"


@pytest.mark.slow
def test_compare_and_set_race_across_replicas(catalog_url: str) -> None:
    with Catalog(catalog_url) as a, Catalog(catalog_url) as b:
        a.create_table("t", [{"name": "id", "type": "int64"}])
        a.commit("t", "setup", add_sources=[{"name": "s", "kind": "files", "state": {}}])
        barrier = threading.Barrier(16)
        won: list[int] = []
        lost: list[int] = []

        def attempt(i: int) -> None:
            barrier.wait()
            try:
                (a, b)[i % 2].commit(
                    "t",
                    f"race-{i}",
                    updates=[{"source": "s", "state": {"by": i}, "expect_state_version": 1}],
                )
                won.append(i)
            except Conflict:
                lost.append(i)

        threads = [threading.Thread(target=attempt, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(won) == 1 and len(lost) == 15
        assert a.describe("t").source("s").state == {"by": won[0]}
        assert b.current_version("t") == 2
