"""A catalog's connections fit its PostgreSQL server: two replicas under many concurrent calls
on a server of few connections wait for pooled ones instead of being refused ("too many
clients already", which failed catalog calls under the full chaos load)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psycopg

from flight_gateway.catalog import Catalog, db
from tests.catalog.workers import commit_many_with
from tests.services import postgres_servers

THREADS = 48
COMMITS = 4


def test_pool_sizes_take_half_of_a_small_server_and_the_defaults_of_a_large_one() -> None:
    assert db.pool_sizes(None) == (db.MAIN_POOL, db.FAST_POOL)
    assert db.pool_sizes(10_000) == (db.MAIN_POOL, db.FAST_POOL)
    for usable in (9, 21, 97, 150):
        (main_kept, main_more), (fast_kept, fast_more) = db.pool_sizes(usable)
        assert main_kept + main_more + fast_kept + fast_more <= max(4, usable // 2)


def test_two_replicas_share_a_small_server_under_load() -> None:
    with postgres_servers(1, max_connections=24) as (url,):
        with psycopg.connect(url, autocommit=True) as conn:
            (limit,) = conn.execute("SHOW max_connections").fetchone()
        assert limit == "24"
        with Catalog(url) as a, Catalog(url) as b:
            a.create_table("t", [{"name": "id", "type": "int64"}])
            sources = [{"name": f"s{i}", "kind": "files", "state": {}} for i in range(THREADS)]
            a.commit("t", "setup", add_sources=sources)

            def work(i: int) -> list[int]:
                cat = (a, b)[i % 2]
                versions = []
                for _ in range(COMMITS):  # reads between commits: many transactions at once
                    cat.describe("t")
                    cat.history("t")
                    versions += commit_many_with(cat, "t", f"s{i}", 1) if not versions else []
                return versions

            with ThreadPoolExecutor(THREADS) as pool:
                produced = sorted(v for f in [pool.submit(work, i) for i in range(THREADS)]
                                  for v in f.result())  # fmt: skip
            assert produced == list(range(2, THREADS + 2))
            assert {s.name: s.state for s in b.describe("t").sources} == {
                f"s{i}": {"high": 1} for i in range(THREADS)
            }
