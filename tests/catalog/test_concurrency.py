"""Many writers at once: disjoint sources never fail, the same source has one winner."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from flight_gateway.catalog import Catalog
from flight_gateway.protocol.errors import Conflict
from tests.catalog.workers import commit_many

N_WRITERS = 16
COMMITS_EACH = 10


def _table_with_sources(cat: Catalog, n: int) -> None:
    cat.create_table("t", [{"name": "id", "type": "int64"}])
    cat.commit(
        "t",
        "setup",
        add_sources=[{"name": f"s{i}", "kind": "files", "state": {"high": 0}} for i in range(n)],
    )


def _assert_gap_free(cat: Catalog, produced: list[int], expected_commits: int) -> None:
    assert len(produced) == expected_commits
    # Every commit got its own version and together they are exactly 2..N+1.
    assert sorted(produced) == list(range(2, expected_commits + 2))
    hist = cat.history("t")
    assert [h.version for h in hist] == list(range(expected_commits + 1, -1, -1))
    final = cat.describe("t")
    assert {s.name: s.state["high"] for s in final.sources} == {
        f"s{i}": COMMITS_EACH for i in range(N_WRITERS)
    }


@pytest.mark.slow
def test_disjoint_committers_threads_never_fail(catalog: Catalog) -> None:
    _table_with_sources(catalog, N_WRITERS)
    with ThreadPoolExecutor(N_WRITERS) as pool:
        futures = [
            pool.submit(commit_many, catalog.url, "t", f"s{i}", COMMITS_EACH)
            for i in range(N_WRITERS)
        ]
        produced = [v for f in futures for v in f.result()]  # any exception fails the test
    _assert_gap_free(catalog, produced, N_WRITERS * COMMITS_EACH)


@pytest.mark.slow
def test_disjoint_committers_processes_never_fail(catalog: Catalog) -> None:
    _table_with_sources(catalog, N_WRITERS)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(N_WRITERS) as pool:
        results = pool.starmap(
            commit_many, [(catalog.url, "t", f"s{i}", COMMITS_EACH) for i in range(N_WRITERS)]
        )
    _assert_gap_free(catalog, [v for r in results for v in r], N_WRITERS * COMMITS_EACH)


def test_same_source_race_has_exactly_one_winner(catalog: Catalog) -> None:
    _table_with_sources(catalog, 1)
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            catalog.commit(
                "t",
                f"race-{i}",
                updates=[{"source": "s0", "state": {"high": i}, "expect_state_version": 1}],
            )
            outcomes.append(f"won-{i}")
        except Conflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(winners) == 1 and outcomes.count("conflict") == 7
    snap = catalog.describe("t")
    assert snap.version == 2
    assert snap.source("s0").state == {"high": int(winners[0].split("-")[1])}


def test_concurrent_duplicate_commit_id_applies_once(catalog: Catalog) -> None:
    _table_with_sources(catalog, 1)
    with ThreadPoolExecutor(8) as pool:
        results = list(
            pool.map(
                lambda _: catalog.commit(
                    "t", "same-id", updates=[{"source": "s0", "state": {"high": 1}}]
                ),
                range(8),
            )
        )
    assert {r.version for r in results} == {2}
    assert sum(r.applied for r in results) == 1
    assert catalog.current_version("t") == 2


@pytest.mark.slow
def test_killed_lock_holder_frees_after_lease(catalog: Catalog) -> None:
    _table_with_sources(catalog, 1)
    ttl = 2.0
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.catalog.workers", catalog.url, "t", "s0", str(ttl)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("LOCKED"), line
        proc.kill()  # SIGKILL: no chance to unlock
        proc.wait(10)
        killed_at = time.monotonic()
        grant = catalog.lock("t", ["s0"], owner="survivor", ttl_s=10, wait_s=ttl + 10)
        waited = time.monotonic() - killed_at
        assert grant.owner == "survivor"
        # Granted once the dead holder's lease ran out, not at the end of our wait budget.
        assert waited < ttl + 5
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_same_create_sent_at_once_is_made_once(catalog: Catalog) -> None:
    """Creates of one table with one commit id racing (a client's retry while its first try
    still runs): one makes it, the others answer as retries (``applied`` false), on both
    backends; on PostgreSQL the losers met the unique name constraint and were ALREADY_EXISTS."""
    schema = [{"name": "id", "type": "int64"}]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: catalog.create_table("r", schema, commit_id="make-r"),
                                range(8)))  # fmt: skip
    assert sorted(r.applied for r in results) == [False] * 7 + [True]
    assert [h.commit_id for h in catalog.history("r")] == ["make-r"]
