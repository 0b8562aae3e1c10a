"""SIGKILL the gateway during group commits, DoGet streams and Flight SQL statements, and the
maintenance process in the middle of its pass. Clients use the failover window to ride out
restarts: every commit id is applied exactly once, every read and statement answers exactly
or fails (never short), and maintenance killed anywhere deletes nothing a kept version needs."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.chaos_load import make_table, rows
from benchmarks.processes import ROOT, GatewayProcess
from clients import HarnessClient
from flight_gateway.catalog import Catalog

pytestmark = [pytest.mark.integration, pytest.mark.slow]
CHAOS_S = float(os.environ.get("HARNESS_CHAOS_S", "15"))


def kill_repeatedly(gw: GatewayProcess, seconds: float, seed: int) -> None:
    rng = random.Random(seed)
    end = time.monotonic() + seconds
    # At least five kills however slow restarts are on a loaded machine (bounded).
    while time.monotonic() < end or (gw.kills < 5 and time.monotonic() < end + 3 * seconds):
        time.sleep(rng.uniform(0.3, 1.2))
        gw.kill()
        gw.start()


def run_threads(targets: list[Callable[[], None]]) -> list[threading.Thread]:
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    return threads


def test_kills_during_group_commits_apply_each_commit_once(
    gateway_process: GatewayProcess,
) -> None:
    gw = gateway_process
    with HarnessClient(gw.uri) as client:
        client.create_table("c", [{"name": "id", "type": "int64"}])
        first = client.describe("c").version
    stop = threading.Event()
    acked: list[str] = []
    errors: list[str] = []

    def committer(n: int) -> None:
        with HarnessClient(gw.uri, failover_s=60) as client:
            for i in range(10**6):
                if stop.is_set():
                    return
                cid = f"w{n}-{i}"
                try:  # no lock: commits of external state only, grouped by the gateway
                    client.commit("c", commit_id=cid, external_state={f"w{n}": i})
                except Exception as e:
                    errors.append(f"{cid}: {type(e).__name__}: {e}")
                    return
                acked.append(cid)

    threads = run_threads([lambda n=n: committer(n) for n in range(6)])
    kill_repeatedly(gw, CHAOS_S, seed=3)
    stop.set()
    for t in threads:
        t.join(120)
    assert errors == []
    with HarnessClient(gw.uri) as client:
        history = client.history("c")
        state = client.describe("c").external_state
    ids = [r.commit_id for r in history if r.version > first]
    assert len(ids) == len(set(ids)), "a commit id was applied twice"
    assert set(ids) == set(acked)
    assert gw.kills >= 5 and len(acked) > 20
    last = {}
    for cid in acked:
        w, i = cid.split("-")
        last[w] = max(last.get(w, -1), int(i))
    assert {k: v for k, v in state.items() if k.startswith("w")} == last


def test_kills_during_reads_and_statements_never_answer_short(
    gateway_process: GatewayProcess, tmp_path: Path, pg_dsn: str
) -> None:
    gw = gateway_process
    with HarnessClient(gw.uri) as client:
        make_table(client, tmp_path, pg_dsn)
        for n, region in enumerate(("files", "iceberg", "postgres")):
            client.put("t", rows(region, n * 100_000, 100_000), source=region)
    expected = set(range(300_000))
    stop = threading.Event()
    errors: list[str] = []
    counts = {"read": 0, "sql": 0, "cut": 0}

    def reader() -> None:
        with HarnessClient(gw.uri, failover_s=60) as client:
            while not stop.is_set():
                ids = client.read("t", columns=["id"]).column("id").to_pylist()
                if len(ids) != len(expected) or set(ids) != expected:
                    errors.append(f"read returned {len(ids)} rows")
                counts["read"] += 1

    def statements() -> None:
        with HarnessClient(gw.uri, failover_s=60) as client:
            while not stop.is_set():
                got = client.sql("SELECT count(*) AS n, sum(id) AS s FROM t").to_pylist()
                if got != [{"n": 300_000, "s": sum(expected)}]:
                    errors.append(f"statement answered {got}")
                counts["sql"] += 1

    def streamer() -> None:
        """Streaming without replicas: a cut stream raises; it never ends short."""
        with HarnessClient(gw.uri, failover_s=60) as client:
            while not stop.is_set():
                seen = 0
                try:
                    for batch in client.read_batches("t", columns=["id"]):
                        seen += batch.num_rows
                except Exception:
                    counts["cut"] += 1
                    continue
                if seen != len(expected):
                    errors.append(f"a stream ended after {seen} rows without an error")

    def guarded(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception as e:  # failover gave up
                errors.append(f"{fn.__name__}: {type(e).__name__}: {e}")

        return run

    threads = run_threads([guarded(f) for f in (reader, reader, statements, streamer)])
    kill_repeatedly(gw, CHAOS_S, seed=5)
    stop.set()
    for t in threads:
        t.join(120)
    assert errors == []
    assert counts["read"] > 0 and counts["sql"] > 0 and gw.kills >= 5


def test_maintenance_killed_anywhere_deletes_nothing_a_kept_version_needs(
    pg_catalog: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    gw = GatewayProcess(pg_catalog, tmp_path)
    gw.start()
    try:
        with HarnessClient(gw.uri) as client:
            client.create_table(
                "m", [{"name": "id", "type": "int64"}], properties={"retention.keep_last": 3}
            )
            client.add_source("m", "f", "files", config={"root": str(data)}, state={"files": []})
            with Catalog(pg_catalog) as cat:  # files named as this catalog names its own
                tag = cat.catalog_tag
            files: list[str] = []
            for i in range(12):  # each version drops the oldest file once it has four
                name = f"harness-{tag}-{i:03d}.parquet"
                pq.write_table(pa.table({"id": range(i * 10, i * 10 + 10)}), data / name)
                files = [*files, name][-4:]
                client.commit("m", updates=[{"source": "f", "state": {"files": files}}])
            versions = [r.version for r in client.history("m")]
            rng = random.Random(11)
            for _ in range(8):
                proc = maintain(pg_catalog)
                time.sleep(rng.uniform(0.3, 3.0))
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
            assert maintain(pg_catalog).wait(120) == 0
            kept = [r.version for r in client.history("m")]
            assert kept == versions[:3]  # newest first
            for v in kept:  # every kept version reads exactly what it listed
                listed = client.describe("m", version=v).source("f").state["files"]
                firsts = [int(f.rsplit("-", 1)[1][:3]) * 10 for f in listed]
                want = sorted(j for first in firsts for j in range(first, first + 10))
                assert sorted(client.read("m", version=v).column("id").to_pylist()) == want
            needed = {
                f for v in kept for f in client.describe("m", version=v).source("f").state["files"]
            }
            assert {p.name for p in data.iterdir()} == needed
    finally:
        gw.stop()


def maintain(catalog_url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flight_gateway.cli",
            "maintain",
            "--catalog",
            catalog_url,
            "--grace",
            "0",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
