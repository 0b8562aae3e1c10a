"""Service-level figures under faults and load (gateways are real processes):

- failover: two replicas on one Postgres catalog; writers DoPut into files, Iceberg,
  versioned Postgres and Kafka sources and readers read the whole table through clients that
  know both replicas, while one replica is SIGKILLed (and restarted) every ``kill_every_s``.
  Reports commits/s and commit latency, read latency, rows lost and rows duplicated (both must
  be 0), and errors (failover that gave up).
- load: one gateway, 64 readers + 16 writers (quick: 16 + 4): errors, commits/s, read p99 and
  the gateway's RSS at the start and the end (goal: flat).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.chaos_load import Load, make_table, percentile_ms
from benchmarks.processes import GatewayProcess
from benchmarks.services import postgres_database
from clients import HarnessClient


def _catalog(dsn: str, schema: str) -> str:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return f"{dsn}?options=-csearch_path%3D{schema}"


def _check(load: Load, uri: str, replicas: list[str]) -> tuple[int, int]:
    """(rows lost, rows duplicated) in a final read against every acknowledged row."""
    with HarnessClient(uri, replicas=replicas) as client:
        ids = client.read("t", columns=["id"]).column("id").to_pylist()
    return len(load.acked - set(ids)), len(ids) - len(set(ids))


def _rows(case: str, load: Load, seconds: float, lost: int, dup: int) -> Iterator[dict[str, Any]]:
    yield {
        "case": f"{case}: commits/s",
        "value": len(load.commit_s) / seconds,
        "unit": "commits/s",
        "p50_ms": percentile_ms(load.commit_s, 50),
        "p99_ms": percentile_ms(load.commit_s, 99),
        "failed": len(load.errors),
        "retries": load.lock_retries,
    }
    yield {
        "case": f"{case}: reads/s",
        "value": len(load.read_s) / seconds,
        "unit": "reads/s",
        "p50_ms": percentile_ms(load.read_s, 50),
        "p99_ms": percentile_ms(load.read_s, 99),
        "failed": len(load.errors),
        **({"failures": "; ".join(load.errors[:6])[:600]} if load.errors else {}),
    }
    yield {"case": f"{case}: rows lost", "value": lost, "unit": "rows"}
    yield {"case": f"{case}: rows duplicated", "value": dup, "unit": "rows"}
    if lost or dup:  # reported above, and the run fails (CI runs the quick mode)
        raise AssertionError(f"{case}: {lost} acknowledged rows lost, {dup} duplicated")


def _limits(writers: int, readers: int) -> dict[str, Any]:
    """Every client here is the one anonymous principal standing in for many users, so the
    per-principal limits (4 uploads, 64 streams by default) are raised to the load's size, as
    an operator would for such a caller; a refusal left over is retried by the client (Busy)."""
    return {
        "limits": {
            "max_uploads_per_principal": writers,
            "max_concurrent_uploads": writers,
            "max_streams_per_principal": 8 * readers + writers,
        }
    }


def _failover(dsn: str, bootstrap: str, root: Path, quick: bool) -> Iterator[dict[str, Any]]:
    seconds, every, writers, readers = (30, 8, 4, 4) if quick else (180, 20, 16, 16)
    url = _catalog(dsn, "failover")
    replicas = [GatewayProcess(url, root, **_limits(writers, readers)) for _ in range(2)]
    for r in replicas:
        r.start()
    try:
        with HarnessClient(replicas[0].uri) as client:
            make_table(client, root / "failover", dsn, bootstrap)
        load = Load([r.uri for r in replicas])
        threads = load.run(writers, readers)
        started = time.monotonic()
        victim = 0
        while time.monotonic() - started < seconds:
            time.sleep(min(every, max(0.0, seconds - (time.monotonic() - started))))
            replicas[victim].kill()
            replicas[victim].start()
            victim = 1 - victim
        load.finish(threads)
        elapsed = time.monotonic() - started
        lost, dup = _check(load, replicas[0].uri, [replicas[1].uri])
        name = f"failover {writers}w+{readers}r, a replica killed every {every}s"
        yield from _rows(name, load, elapsed, lost, dup)
        yield {"case": "failover: replica kills", "value": sum(r.kills for r in replicas)}
    finally:
        for r in replicas:
            r.stop()


@contextlib.contextmanager
def _maintained(url: str, every_s: float = 10.0) -> Iterator[None]:
    """Maintenance every ``every_s`` while the load runs, as an operator runs it: versions past
    ``retention.keep_last`` expire, and with them Iceberg snapshots and unreferenced files
    (after a grace longer than a read takes here). Without it every Iceberg commit rewrites a
    metadata file listing every snapshot so far, and commits slow down as the run goes on."""
    import threading

    from flight_gateway.catalog import Catalog
    from flight_gateway.maintenance import run_once

    catalog, stop = Catalog(url), threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            run_once(catalog, grace_s=300)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(120)
        catalog.close()


def _load(dsn: str, bootstrap: str, root: Path, quick: bool) -> Iterator[dict[str, Any]]:
    seconds, writers, readers = (20, 4, 16) if quick else (600, 16, 64)
    url = _catalog(dsn, "load")
    gw = GatewayProcess(url, root, **_limits(writers, readers))
    gw.start()
    try:
        with HarnessClient(gw.uri) as client:
            make_table(client, root / "load", dsn, bootstrap)
            # Versions older than the last 2,000 (a few minutes here) expire.
            client.commit("t", properties={"retention.keep_last": 2000})
        load = Load([gw.uri])
        with _maintained(url):
            threads = load.run(writers, readers)
            time.sleep(min(10.0, seconds / 4))
            rss_start = gw.rss_mb()
            started = time.monotonic()
            time.sleep(seconds)
            rss_end = gw.rss_mb()
            load.finish(threads)
        elapsed = time.monotonic() - started
        lost, dup = _check(load, gw.uri, [])
        yield from _rows(f"load {writers}w+{readers}r", load, elapsed, lost, dup)
        yield {"case": "load: gateway RSS at start", "value": rss_start, "unit": "MB"}
        yield {
            "case": "load: gateway RSS at end",
            "value": rss_end,
            "unit": "MB",
            "ratio": rss_end / rss_start,
            "ratio_vs": "RSS at start",
        }
    finally:
        gw.stop()


def run(quick: bool = False) -> Iterator[dict[str, Any]]:
    from flight_gateway.local_kafka import local_broker

    with (
        postgres_database() as dsn,
        tempfile.TemporaryDirectory() as tmp,
        contextlib.ExitStack() as stack,
    ):
        if dsn is None:
            return
        bootstrap = stack.enter_context(local_broker())
        yield from _failover(dsn, bootstrap, Path(tmp), quick)
        yield from _load(dsn, bootstrap, Path(tmp), quick)
