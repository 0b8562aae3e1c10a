"""Replicas on one Postgres catalog, one killed (SIGKILL) and restarted again and again while
writers and readers use clients that know every replica: no acknowledged row lost, none
duplicated, every read holds exactly the rows acknowledged before it began and no row twice."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from clients import HarnessClient
from tests.chaos.processes import GatewayProcess
from tests.chaos.test_kill_writes import REGIONS, make_table, rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]
#: Quick mode for ``make test``; the long mode (bench) runs 16 + 16 for 3 minutes.
CHAOS_S = float(os.environ.get("HARNESS_CHAOS_S", "20"))
WRITERS = int(os.environ.get("HARNESS_CHAOS_WRITERS", "4"))
READERS = int(os.environ.get("HARNESS_CHAOS_READERS", "4"))


class Load:
    """Writers append batches with fresh ids; readers check each read against what was
    acknowledged before it began."""

    def __init__(self, uris: list[str]) -> None:
        self.uris = uris
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: set[int] = set()
        self.errors: list[str] = []
        self.reads = 0
        self.commits = 0

    def client(self, n: int) -> HarnessClient:
        first = n % len(self.uris)  # spread clients over the replicas
        order = self.uris[first:] + self.uris[:first]
        return HarnessClient(order[0], replicas=order[1:], failover_s=60)

    def write(self, n: int) -> None:
        region = REGIONS[n % len(REGIONS)]
        with self.client(n) as client:
            for i in range(10**6):
                if self.stop.is_set():
                    return
                first = (n * 10**6 + i) * 100
                try:
                    client.put("t", rows(region, first, 100), source=region)
                except Exception as e:  # failover gave up: a failure of the test
                    self.errors.append(f"writer {n}: {type(e).__name__}: {e}")
                    return
                with self.lock:
                    self.acked.update(range(first, first + 100))
                    self.commits += 1

    def read(self, n: int) -> None:
        with self.client(n) as client:
            while not self.stop.is_set():
                with self.lock:
                    before = set(self.acked)
                try:
                    ids = client.read("t", columns=["id"]).column("id").to_pylist()
                except Exception as e:
                    self.errors.append(f"reader {n}: {type(e).__name__}: {e}")
                    return
                if len(ids) != len(set(ids)):
                    self.errors.append(f"reader {n}: {len(ids) - len(set(ids))} rows twice")
                if missing := before - set(ids):
                    self.errors.append(f"reader {n}: {len(missing)} acknowledged rows missing")
                with self.lock:
                    self.reads += 1


def test_replica_killed_under_load_loses_and_duplicates_nothing(
    pg_catalog: str, tmp_path: Path, pg_dsn: str, kafka_bootstrap: str
) -> None:
    replicas = [GatewayProcess(pg_catalog, tmp_path) for _ in range(2)]
    for r in replicas:
        r.start()
    try:
        with HarnessClient(replicas[0].uri) as client:
            make_table(client, tmp_path, pg_dsn, kafka_bootstrap)
        load = Load([r.uri for r in replicas])
        threads = [threading.Thread(target=load.write, args=(n,)) for n in range(WRITERS)]
        threads += [threading.Thread(target=load.read, args=(n,)) for n in range(READERS)]
        for t in threads:
            t.start()
        rng = random.Random(7)
        end = time.monotonic() + CHAOS_S
        victim = 0
        while time.monotonic() < end:
            time.sleep(rng.uniform(1.0, 3.0))
            replicas[victim].kill()
            time.sleep(rng.uniform(0.5, 2.0))  # the other replica serves alone meanwhile
            replicas[victim].start()
            victim = 1 - victim
        load.stop.set()
        for t in threads:
            t.join(120)
        assert load.errors == []
        assert sum(r.kills for r in replicas) >= 3
        assert load.commits > 0 and load.reads > 0
        with HarnessClient(replicas[1].uri, replicas=[replicas[0].uri]) as client:
            ids = client.read("t", columns=["id"]).column("id").to_pylist()
        assert len(ids) == len(set(ids))
        assert set(ids) == load.acked
    finally:
        for r in replicas:
            r.stop()


def test_single_gateway_client_fails_at_once_when_it_is_down(tmp_path: Path) -> None:
    gw = GatewayProcess(f"sqlite:///{tmp_path / 'c.db'}", tmp_path)
    gw.start()
    gw.kill()
    started = time.monotonic()
    with HarnessClient(gw.uri) as client, pytest.raises(Exception, match="unavailable"):
        client.list_tables()
    assert time.monotonic() - started < 10
