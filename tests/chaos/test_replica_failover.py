"""Replicas on one Postgres catalog, one killed (SIGKILL) and restarted again and again while
writers and readers use clients that know every replica: no acknowledged row lost, none
duplicated, every read holds exactly the rows acknowledged before it began and no row twice."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from benchmarks.chaos_load import Load, make_table
from benchmarks.processes import GatewayProcess
from clients import HarnessClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]
#: Quick mode for ``make test``; the long mode (bench) runs 16 + 16 for 3 minutes.
CHAOS_S = float(os.environ.get("HARNESS_CHAOS_S", "20"))
WRITERS = int(os.environ.get("HARNESS_CHAOS_WRITERS", "4"))
READERS = int(os.environ.get("HARNESS_CHAOS_READERS", "4"))


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
        threads = load.run(WRITERS, READERS)
        rng = random.Random(7)
        end = time.monotonic() + CHAOS_S
        victim = 0
        kills = lambda: sum(r.kills for r in replicas)  # noqa: E731
        while time.monotonic() < end or (kills() < 3 and time.monotonic() < end + 3 * CHAOS_S):
            time.sleep(rng.uniform(1.0, 3.0))
            replicas[victim].kill()
            time.sleep(rng.uniform(0.5, 2.0))  # the other replica serves alone meanwhile
            replicas[victim].start()
            victim = 1 - victim
        load.finish(threads)
        assert load.errors == []
        assert sum(r.kills for r in replicas) >= 3
        assert load.commit_s and load.read_s
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
