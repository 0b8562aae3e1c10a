"""Catalog commits per second with 1, 4 and 16 concurrent writers on disjoint sources.

Each writer is a separate process with its own catalog connection, committing compare-and-set
state updates to its own source, as movers on separate partitions do. The ratio compares the
aggregate rate with one writer's rate on the same backend: above 1 means concurrent writers add
throughput, below 1 means they only queue (they never fail or retry either way; failures are
counted and reported).
"""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from pathlib import Path

from benchmarks.services import postgres_database
from flight_gateway.catalog import Catalog


def _writer(url: str, source: str, n: int, start_at: float) -> tuple[int, int]:
    cat = Catalog(url)
    while time.time() < start_at:
        time.sleep(0.001)
    ok = failed = 0
    for i in range(n):
        try:
            cat.commit(
                "bench",
                f"{source}-{i}",
                updates=[
                    {"source": source, "state": {"high": i + 1}, "expect_state_version": i + 1}
                ],
            )
            ok += 1
        except Exception:
            failed += 1
    cat.close()
    return ok, failed


def _measure(url: str, writers: int, commits_each: int) -> dict:
    with Catalog(url) as cat:
        cat.create_table("bench", [{"name": "id", "type": "int64"}])
        cat.commit(
            "bench",
            "setup",
            add_sources=[
                {"name": f"s{i}", "kind": "files", "state": {"high": 0}} for i in range(writers)
            ],
        )
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(writers) as pool:
        start_at = time.time() + 1.5  # let every process import and connect first
        t0 = time.perf_counter() + (start_at - time.time())
        results = pool.starmap(
            _writer, [(url, f"s{i}", commits_each, start_at) for i in range(writers)]
        )
        elapsed = time.perf_counter() - t0
    ok = sum(r[0] for r in results)
    failed = sum(r[1] for r in results)
    with Catalog(url) as cat:
        versions = cat.current_version("bench")
        cat.drop_table("bench")
    assert versions == ok + 1, "versions must be gap-free"
    return {"commits": ok, "failed": failed, "seconds": elapsed, "rate": ok / elapsed}


def run(quick: bool = False) -> list[dict]:
    commits_each = 20 if quick else 100
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, postgres_database() as pg:
        backends = {"sqlite": f"sqlite:///{Path(tmp) / 'catalog.db'}"}
        if pg:
            backends["postgres"] = pg
        for backend, url in backends.items():
            base = None
            for writers in (1, 4, 16):
                m = _measure(url, writers, commits_each)
                base = base or m["rate"]
                rows.append(
                    {
                        "case": f"{backend}, {writers} writers",
                        "value": round(m["rate"], 1),
                        "unit": "commits/s",
                        "ratio": round(m["rate"] / base, 2),
                        "ratio_vs": f"{backend}, 1 writer",
                        "failed": m["failed"],
                        "commits": m["commits"],
                    }
                )
    return rows
