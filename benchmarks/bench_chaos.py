"""Service-level figures under faults and load (gateways are real processes):

- failover: two replicas on one Postgres catalog; writers DoPut into files, Iceberg,
  versioned Postgres and Kafka sources and readers read the whole table through clients that
  know both replicas, while one replica is SIGKILLed (and restarted) every ``kill_every_s``,
  and maintenance, bin-pack compaction and the Kafka-to-Iceberg mover run as in the load
  (``_maintained``, through clients that fail over too: without the mover every read consumed
  every message put so far, and read p99 reached 107-172 s). Reports commits/s and commit
  latency, read latency, rows lost and rows duplicated (both must be 0), errors (failover that
  gave up) and maintenance steps cut by a kill (run again at their next turn).
- load: one gateway, 64 readers + 16 writers (quick: 16 + 4) with maintenance, bin-pack
  compaction and a Kafka-to-Iceberg mover running as an operator runs them: errors, commits/s, read p99 and the
  gateway's RSS, rows, read p50 and reads in the first and the last fifth; then the same load
  through a freshly started gateway on the final table (``_control``): the last fifth's RSS
  against the fresh gateway's says whether memory grows with time (goal: flat, ~1) rather than
  with the table.

Readers check every read against the ids acknowledged before it began (``check_ids``,
vectorised: the check of a growing table would otherwise take a growing share of the same two
cores the gateway runs on).
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.chaos_load import ARROW, Load, lost_and_doubled, make_table, percentile_ms
from benchmarks.compaction import compact
from benchmarks.processes import GatewayProcess
from benchmarks.services import postgres_database
from clients import HarnessClient
from flight_gateway.local.kafka import free_port
from pipelines.compaction import bin_pack

log = logging.getLogger(__name__)
#: Bin-pack compaction leaves files of this size or more as they are (~250,000 rows here).
PACKED_BYTES = 8 << 20


#: Versions kept (``retention.keep_last``): more than the longest read lasts. 2,000 were a few
#: minutes at 12 commits/s; at 45 (2026-12-04) they were 44 s, and in the last fifth, on the
#: 2.4 M-row table, reads of 70-120 s found their version expired (NotFound, nothing lost).
KEEP_LAST = 8000


def _catalog(dsn: str, schema: str) -> str:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return f"{dsn}?options=-csearch_path%3D{schema}"


def _check(load: Load, uri: str, replicas: list[str]) -> tuple[int, int]:
    """(rows lost, rows duplicated) in a final read against every acknowledged row."""
    with HarnessClient(uri, replicas=replicas) as client:
        ids = client.read("t", columns=["id"]).column("id")
    return lost_and_doubled(load.acked_ids(), ids)


def _rows(case: str, load: Load, seconds: float, lost: int, dup: int) -> Iterator[dict[str, Any]]:
    yield {
        "case": f"{case}: commits/s",
        "value": len(load.commit_s) / seconds,
        "unit": "commits/s",
        "p50_ms": percentile_ms(load.commit_s, 50),
        "p99_ms": percentile_ms(load.commit_s, 99),
        "failed": len(load.errors),
        "retries": load.lock_retries,
        "left_at_stop": load.left_at_stop,
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


def _config(writers: int, readers: int) -> dict[str, Any]:
    """The gateway as an operator configures it for this load. Every client here is the one
    anonymous principal standing in for many users, so the per-principal limits (4 uploads,
    64 streams by default) are raised to the load's size; a refusal left over is retried by
    the client (Busy). DoGet streams are read in two processes of their own (one per core,
    ``read_processes``): in the gateway's process the readers' Python held the interpreter
    lock the writers' commits waited for. They run at the default priority (nice 5): at 19
    the writers' commit p99 fell from 4.7-7.2 s to 1.2-1.6 s, but readers starved (the last
    fifth's read p50 2.6-3.0x a fresh gateway's; docs/operations.md, 2026-12-03). One stream
    of each makes a batch at a time (``read_processes_running``): the kernel shares the cores
    by thread, and 64 streams' threads at nice 5 outweighed the writers' few at nice 0 (60-s
    windows: 22.0 commits/s, p99 2.26 s unbounded; 45.2/s, p99 1.12 s with one; 2026-12-04)."""
    return {
        "read_processes": 2,
        "read_processes_running": 1,
        "limits": {
            "max_uploads_per_principal": writers,
            "max_concurrent_uploads": writers,
            "max_streams_per_principal": 8 * readers + writers,
        },
    }


def _failover(dsn: str, bootstrap: str, root: Path, quick: bool) -> Iterator[dict[str, Any]]:
    seconds, every, writers, readers = (30, 8, 4, 4) if quick else (180, 20, 16, 16)
    url = _catalog(dsn, "failover")
    replicas = [GatewayProcess(url, root, **_config(writers, readers)) for _ in range(2)]
    for r in replicas:
        r.start()
    try:
        with HarnessClient(replicas[0].uri) as client:
            make_table(client, root / "failover", dsn, bootstrap)
            client.commit("t", properties={"retention.keep_last": KEEP_LAST})  # as in ``_load``
        uris = [r.uri for r in replicas]
        load = Load(uris)
        with _maintained(url, uris, 8.0 if quick else 15.0) as maintenance:
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
        # A step cut by a kill fails and runs again at its next turn: counted, not fatal.
        yield {"case": "failover: maintenance", "value": maintenance["maintenance runs"],
               **maintenance}  # fmt: skip
    finally:
        for r in replicas:
            r.stop()


@contextlib.contextmanager
def _maintained(
    url: str,
    uris: list[str],
    compact_every_s: float,
    every_s: float = 10.0,
    move_every_s: float = 15.0,
) -> Iterator[Counter[str]]:
    """Maintenance while the load runs, as an operator runs it, each task on its own schedule
    (the pause is between one run's end and the next one's start), through clients of the
    gateways at ``uris`` (the first, failing over to the others):

    - every ``every_s``, versions past ``retention.keep_last`` expire, and with them Iceberg
      snapshots and unreferenced files (after a grace longer than a read takes here);
    - every ``compact_every_s`` the small files of the files and Iceberg sources are
      bin-packed into one (``pipelines.compaction.bin_pack``: files of ``PACKED_BYTES`` or
      more stay as they are). Rewriting each whole source every minute fell behind the writers
      once the table passed ~2 M rows (2026-12-03: 626 files listed at the end against 284), and
      its reads took cores from them; a bin-pack costs what was written since the last one.
      In its own thread: behind the expiry pass, which takes 30-50 s under the full load,
      compaction ran every 3-4 minutes instead of every minute, and reads opened up to 150
      files;
    - every ``move_every_s`` a mover flushes the Kafka source's rows to Iceberg (``low = high``).

    Without expiry every Iceberg commit rewrites a metadata file listing every snapshot so far;
    without compaction every read opens every file a writer ever added; without the mover every
    read consumes every message ever put into Kafka: each makes reads slower, and hold more
    memory for longer, as the run goes on. Yields counts of runs, compactions, moves and
    failures."""
    import threading

    from flight_gateway.catalog import Catalog
    from flight_gateway.core.maintenance import run_once
    from flight_gateway.protocol.errors import Conflict, LockUnavailable
    from pipelines.mover import Mover

    catalog, stop, counts = Catalog(url), threading.Event(), Counter[str]()

    def maintain(_client: HarnessClient) -> None:
        run_once(catalog, grace_s=300)
        counts["maintenance runs"] += 1

    def compact_all(client: HarnessClient) -> None:
        for source in ("files", "iceberg"):
            try:
                packed = bin_pack(client, "t", source, small_bytes=PACKED_BYTES)
                counts["compactions"] += packed is not None
            except ValueError:  # rows only the gateway reads (deletes to apply): all of them
                compact(client, "t", source, ARROW, direct=True)
                counts["whole compactions"] += 1
            except (LockUnavailable, Conflict):  # rewritten or deleted from meanwhile, each
                counts["compactions put off"] += 1  # of its attempts: next time

    def move(client: HarnessClient) -> None:
        mover = Mover(client, "t", "kafka", "iceberg")
        try:
            counts["moves"] += mover.run_once().version is not None
        except (LockUnavailable, Conflict):  # moved or held past the wait: next time
            counts["moves put off"] += 1

    def loop(step: Any, pause_s: float) -> None:
        with HarnessClient(uris[0], replicas=uris[1:], busy_wait_s=120) as client:
            while not stop.wait(pause_s):
                try:
                    step(client)
                except Exception:
                    log.exception("maintenance failed")
                    counts["failures"] += 1

    threads = [
        threading.Thread(target=loop, args=(step, pause_s), daemon=True)
        for step, pause_s in (
            (maintain, every_s),
            (compact_all, compact_every_s),
            (move, move_every_s),
        )
    ]
    for t in threads:
        t.start()
    try:
        yield counts
    finally:
        stop.set()
        for t in threads:
            t.join(180)
        catalog.close()


def _load(dsn: str, bootstrap: str, root: Path, quick: bool) -> Iterator[dict[str, Any]]:
    seconds, writers, readers = (20, 4, 16) if quick else (600, 16, 64)
    compact_every_s = 8.0 if quick else 15.0
    url = _catalog(dsn, "load")
    gw = GatewayProcess(url, root, metrics_port=free_port(), **_config(writers, readers))
    gw.start()
    try:
        with HarnessClient(gw.uri) as client:
            make_table(client, root / "load", dsn, bootstrap)
            client.commit("t", properties={"retention.keep_last": KEEP_LAST})
        load = Load([gw.uri])
        with _maintained(url, [gw.uri], compact_every_s) as maintenance:
            rss, elapsed = _run_sampled(load, gw, (writers, readers), seconds)
        time.sleep(5.0 if quick else 35.0)  # idle past one malloc_trim period (30 s)
        rss_idle = gw.rss_mb()
        lost, dup = _check(load, gw.uri, [])
        yield from _rows(f"load {writers}w+{readers}r", load, elapsed, lost, dup)
        yield from _rss_rows(rss, load)
        yield {"case": "load: gateway RSS idle after the load", "value": rss_idle, "unit": "MB"}
        yield from _control(url, gw, (writers, readers), quick, compact_every_s, rss)
        yield {"case": "load: maintenance", "value": maintenance["maintenance runs"], **maintenance}
        if maintenance["failures"]:
            raise RuntimeError(f"load: maintenance failed {maintenance['failures']} time(s)")
    finally:
        gw.stop()


def _run_sampled(
    load: Load, gw: GatewayProcess, counts: tuple[int, int], seconds: float, **kw: float
) -> tuple[list[dict[str, float]], float]:
    """Run the load (``counts``: writers, readers), sample the gateway's memory for
    ``seconds`` after ``warm_s`` (10) with the table's rows (``rows_before`` + those this load
    put); (samples, seconds from the first sample to the end of the load)."""
    threads = load.run(*counts)
    time.sleep(kw.get("warm_s", 10.0))
    started = time.monotonic()
    before = int(kw.get("rows_before", 0))
    samples = _sampled_rss(
        gw, seconds, rows=lambda: before + load.acked_rows, files=lambda: _files_listed(gw.uri)
    )
    load.finish(threads)
    return samples, time.monotonic() - started


def _control(
    url: str,
    gw: GatewayProcess,
    counts: tuple[int, int],
    quick: bool,
    compact_every_s: float,
    long_run: list[dict[str, float]],
) -> Iterator[dict[str, Any]]:
    """The same load, maintenance included, on the same (now larger) table through a freshly
    started gateway, for as long as one fifth of the run after a minute's warm-up. Under the
    long run the table grows (about 14-fold over 10 minutes), and each of the 64 readers holds
    more of it in flight: what the gateway holds for the data it serves grows with it. A
    gateway whose memory grows with time, not data, would hold more at the end of the long
    run than a fresh one does under the same load on the same table; a flat one, the same."""
    fifth_s = 4.0 if quick else 120.0
    gw.stop()
    gw.start()
    load = Load([gw.uri], first_id=10**12)  # ids the long run never put
    with _maintained(url, [gw.uri], compact_every_s) as maintenance:
        rss, _ = _run_sampled(
            load,
            gw,
            counts,
            fifth_s,
            warm_s=4.0 if quick else 60.0,
            rows_before=long_run[-1]["rows"],  # the table's rows when it ended
        )
    lost, dup = _check(load, gw.uri, [])
    if lost or dup or load.errors or maintenance["failures"]:
        raise AssertionError(
            f"load, fresh gateway: {lost} lost, {dup} duplicated, errors {load.errors[:3]}, "
            f"{maintenance['failures']} maintenance failures"
        )
    part = _part(rss, load)
    fresh = part.pop("rss MB")
    last = statistics.median(s["rss MB"] for s in long_run[-max(2, len(long_run) // 5) :])
    yield {
        "case": "load: fresh gateway, same load on the final table, RSS median",
        "value": fresh,
        "unit": "MB",
        **part,
    }
    yield {
        "case": "load: gateway RSS, last fifth against the fresh gateway",
        "value": round(last / fresh, 3),
        "unit": "x",
        "ratio": round(last / fresh, 3),
        "ratio_vs": "a fresh gateway on the same table (flat in time: ~1)",
    }


def _files_listed(uri: str) -> int:
    """How many files the table's files sources list at its current version: a read checks
    and opens each, so its time follows this count between compactions."""
    with HarnessClient(uri) as client:
        info = client.describe("t")
    return sum(len(s.state.get("files", ())) for s in info.sources if s.kind == "files")


def _sampled_rss(
    gw: GatewayProcess,
    seconds: float,
    rows: Callable[[], int],
    files: Callable[[], int],
    every_s: float = 5.0,
) -> list[dict[str, float]]:
    """The gateway's RSS and memory metrics, the table's acknowledged ``rows`` and the
    ``files`` its files sources list, every ``every_s`` for ``seconds``."""

    def sample() -> dict[str, float]:
        resident = gw.resident()
        return {
            "t": time.perf_counter(),
            "rss MB": resident["VmRSS"],
            "rows": rows(),
            "files": files(),
            "anon MB": resident["RssAnon"],
            "file MB": resident["RssFile"],
            **gw.breakdown(),
        }

    samples, end = [sample()], time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(every_s, max(0.0, end - time.monotonic())))
        samples.append(sample())
    return samples


def _part(samples: list[dict[str, float]], load: Load) -> dict[str, float]:
    """Medians of a part of the samples, with the reads and commits that ended within it."""
    keys = [k for k in samples[0] if k != "t"]
    medians = {k: round(statistics.median(s[k] for s in samples), 1) for k in keys}
    return {**medians, **load.window(samples[0]["t"], samples[-1]["t"])}


def _rss_rows(samples: list[dict[str, float]], load: Load) -> Iterator[dict[str, Any]]:
    """RSS over the first and the last fifth of the run (medians: under 80 clients the resident
    size swings by hundreds of MB within a minute as buffers are taken and trimmed, so one
    sample at each end says little), its peak, and the same medians of the gateway's memory
    metrics (where the memory is), with the table's rows and the reads and commits of each
    fifth. Flat: the last fifth's median near the first's."""
    fifth = max(2, len(samples) // 5)
    start, end = _part(samples[:fifth], load), _part(samples[-fifth:], load)
    rss0, rss1 = start.pop("rss MB"), end.pop("rss MB")
    yield {"case": "load: gateway RSS, median of the first fifth", "value": rss0, "unit": "MB",
           **start}  # fmt: skip
    peak = max(s["rss MB"] for s in samples)
    yield {"case": "load: gateway RSS, peak", "value": peak, "unit": "MB"}
    yield {
        "case": "load: gateway RSS, median of the last fifth",
        "value": rss1,
        "unit": "MB",
        "ratio": rss1 / rss0,
        "ratio_vs": "the first fifth",
        **end,
    }


def run(quick: bool = False) -> Iterator[dict[str, Any]]:
    from flight_gateway.local.kafka import local_broker

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
