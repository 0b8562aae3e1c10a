"""Commit throughput and latency with 1, 4, 16 and 64 writers on disjoint sources.

Every writer commits compare-and-set state updates to its own source, as movers on separate
partitions do, and times each commit. Two paths, on SQLite and Postgres catalogs:

- in process: the writers are threads of one process sharing one ``Catalog`` (group commit
  batches their concurrent commits);
- Flight: a gateway runs in its own process and the writers call ``harness.commit`` through
  DoAction from client processes (threads spread over up to four processes, so the client side
  is not one interpreter's lock).

Writers never fail or retry; failures are counted and reported. The ratio compares the rate with
one writer on the same path and backend.
"""

from __future__ import annotations

import multiprocessing
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks.services import postgres_database
from flight_gateway.catalog import Catalog

WRITERS = (1, 4, 16, 64)
CLIENT_PROCESSES = 4


def _setup(url: str, writers: int) -> None:
    with Catalog(url) as cat:
        if "bench" in cat.list_tables():
            cat.drop_table("bench")
        cat.create_table("bench", [{"name": "id", "type": "int64"}])
        cat.commit(
            "bench",
            "setup",
            add_sources=[
                {"name": f"s{i}", "kind": "files", "state": {"high": 0}} for i in range(writers)
            ],
        )


def _run_writers(
    commit: Callable[[int, int], None], ids: list[int], n: int, start_at: float
) -> tuple[list[float], int]:
    """Threads committing ``n`` times each; returns per-commit latencies and failures."""
    latencies: list[float] = []
    failed = [0]
    lock = threading.Lock()

    def writer(w: int) -> None:
        mine: list[float] = []
        bad = 0
        while time.time() < start_at:
            time.sleep(0.001)
        for i in range(n):
            t0 = time.perf_counter()
            try:
                commit(w, i)
            except Exception:
                bad += 1
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)
            failed[0] += bad

    threads = [threading.Thread(target=writer, args=(w,)) for w in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, failed[0]


def _update(w: int, i: int) -> dict[str, Any]:
    return {"source": f"s{w}", "state": {"high": i + 1}, "expect_state_version": i + 1}


def _in_process(url: str, writers: int, n: int) -> tuple[list[float], int, float]:
    with Catalog(url) as cat:

        def commit(w: int, i: int) -> None:
            cat.commit("bench", f"s{w}-{i}", updates=[_update(w, i)])

        start_at = time.time() + 0.2
        t0 = time.perf_counter() + (start_at - time.time())
        lat, failed = _run_writers(commit, list(range(writers)), n, start_at)
        return lat, failed, time.perf_counter() - t0


def _client_process(uri: str, ids: list[int], n: int, start_at: float, out: Connection) -> None:
    from clients.client import HarnessClient

    clients = {w: HarnessClient(uri) for w in ids}

    def commit(w: int, i: int) -> None:
        clients[w].commit("bench", commit_id=f"s{w}-{i}", updates=[_update(w, i)])

    out.send(_run_writers(commit, ids, n, start_at))
    for c in clients.values():
        c.close()


def _gateway_process(url: str, ready: Connection) -> None:
    from flight_gateway.app import GatewayConfig, HarnessFlightServer

    catalog = Catalog(url)
    server = HarnessFlightServer(
        catalog, GatewayConfig(port=0, allow_anonymous=True, ticket_key="bench-ticket-key-0123")
    )
    ready.send(server.port)
    server.serve()


def _through_flight(uri: str, writers: int, n: int) -> tuple[list[float], int, float]:
    ctx = multiprocessing.get_context("spawn")
    procs, pipes = [], []
    start_at = time.time() + 3.0  # every client process imports and connects first
    for p in range(min(writers, CLIENT_PROCESSES)):
        ids = list(range(p, writers, CLIENT_PROCESSES))
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_client_process, args=(uri, ids, n, start_at, send))
        proc.start()
        procs.append(proc)
        pipes.append(recv)
    t0 = time.perf_counter() + (start_at - time.time())
    lat: list[float] = []
    failed = 0
    for recv in pipes:
        part, bad = recv.recv()
        lat += part
        failed += bad
    elapsed = time.perf_counter() - t0
    for proc in procs:
        proc.join()
    return lat, failed, elapsed


def _row(path: str, backend: str, writers: int, m: tuple[list[float], int, float]) -> dict:
    lat, failed, elapsed = m
    ok = len(lat) - failed
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else lat * 99
    return {
        "case": f"{path}, {backend}, {writers} writers",
        "value": round(ok / elapsed, 1),
        "unit": "commits/s",
        "p50_ms": round(q[49] * 1000, 2),
        "p99_ms": round(q[98] * 1000, 2),
        "failed": failed,
        "commits": ok,
    }


def _backend_rows(backend: str, url: str, commits: int) -> list[dict]:
    rows: list[dict] = []
    for path in ("in process", "Flight DoAction"):
        gateway = None
        if path == "Flight DoAction":
            ctx = multiprocessing.get_context("spawn")
            recv, send = ctx.Pipe(duplex=False)
            gateway = ctx.Process(target=_gateway_process, args=(url, send), daemon=True)
            gateway.start()
            uri = f"grpc://127.0.0.1:{recv.recv()}"
        base = None
        for writers in WRITERS:
            _setup(url, writers)
            n = max(commits // writers, 10)
            if gateway is None:
                m = _in_process(url, writers, n)
            else:
                m = _through_flight(uri, writers, n)
            row = _row(path, backend, writers, m)
            base = base or row["value"]
            row.update(ratio=round(row["value"] / base, 2), ratio_vs=f"{path}, 1 writer")
            rows.append(row)
            with Catalog(url) as cat:
                assert cat.current_version("bench") == row["commits"] + 1, "gap-free versions"
        if gateway is not None:
            gateway.kill()
            gateway.join()
    return rows


def run(quick: bool = False) -> list[dict]:
    """``commits``: total per case, spread over the writers (at least 10 each)."""
    commits = 640 if quick else 3200
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, postgres_database() as pg:
        backends = {"sqlite": f"sqlite:///{Path(tmp) / 'catalog.db'}"}
        if pg:
            backends["postgres"] = pg
        for backend, url in backends.items():
            rows += _backend_rows(backend, url, commits)
    return rows
