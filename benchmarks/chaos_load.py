"""A table with one source per writable kind, and a load of writers and readers that checks
every read: shared by the chaos tests (tests/chaos) and the chaos benchmark."""

from __future__ import annotations

import contextlib
import sqlite3
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from clients import HarnessClient

SCHEMA = [
    {"name": "id", "type": "int64", "nullable": False},
    {"name": "region", "type": "string"},
]
ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False), ("region", pa.string())])
REGIONS = ("files", "iceberg", "postgres", "kafka")


def make_table(
    client: HarnessClient, root: Path, pg_dsn: str, kafka_bootstrap: str | None = None
) -> None:
    """Table ``t`` partitioned by ``region``: files, Iceberg, versioned Postgres and (when a
    broker is given) Kafka sources, all empty."""
    import psycopg
    from pyiceberg.catalog.sql import SqlCatalog

    from planners.postgres.versioning import enable_versioning, server_now

    (root / "warehouse").mkdir(parents=True, exist_ok=True)
    props = {"uri": f"sqlite:///{root / 'iceberg.db'}", "warehouse": f"file://{root / 'warehouse'}"}
    iceberg = SqlCatalog("default", **props)
    # Write-ahead logging (kept by the file): a reader of the catalog never blocks a writer.
    # Read processes run at a lower priority; a starved one that held a rollback journal's
    # shared lock made every other process's Iceberg commit wait, then fail "database is
    # locked" (bench_chaos with read_processes_nice = 19, 2026-11-30).
    with contextlib.closing(sqlite3.connect(root / "iceberg.db")) as db:
        db.execute("PRAGMA journal_mode=WAL")
    iceberg.create_namespace_if_not_exists("db")
    iceberg.create_table("db.chaos", schema=ARROW)
    pg = f"chaos_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{pg}" (id bigint NOT NULL, region text)')
        enable_versioning(conn, pg)
        as_of = server_now(conn)
    configs: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        # Files and Iceberg allow direct tasks: compaction, an operator's job beside the
        # data, reads their files itself rather than through the gateway's read processes.
        "files": ({"root": str(root / "files"), "direct": True}, {"files": []}),
        "iceberg": (
            {"catalog": {"type": "sql", **props}, "identifier": "db.chaos", "direct": True},
            {"snapshot_id": None},
        ),
        "postgres": ({"dsn": pg_dsn, "table": pg}, {"as_of": as_of}),
    }
    if kafka_bootstrap:
        config = {"bootstrap_servers": kafka_bootstrap, "topic": _topic(kafka_bootstrap)}
        configs["kafka"] = ({**config, "partition": 0}, {"low": 0, "high": 0})
    client.create_table("t", SCHEMA, partition_by=["region"])
    client.commit(
        "t",
        add_sources=[
            {"name": r, "kind": r, "partition": {"region": r}, "config": c, "state": s}
            for r, (c, s) in configs.items()
        ],
    )


def _topic(bootstrap: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"chaos-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)]).values():
        f.result(30)
    return name


def rows(region: str, first: int, n: int) -> pa.Table:
    return pa.table({"id": range(first, first + n), "region": [region] * n}, schema=ARROW)


class Load:
    """Writers append batches of fresh ids through clients that know every replica; readers
    check each read against what was acknowledged before it began (no row twice, none
    missing). Latencies are kept for the benchmark."""

    def __init__(
        self,
        uris: list[str],
        regions: tuple[str, ...] = REGIONS,
        batch: int = 100,
        first_id: int = 0,
    ):
        """``first_id``: where this load's ids start, so a second load on the same table puts
        ids the first never did (its readers check its own acknowledged ids)."""
        self.uris, self.regions, self.batch, self.first_id = uris, regions, batch, first_id
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.firsts: list[int] = []  # first id of every acknowledged batch (of ``batch`` ids)
        self.errors: list[str] = []
        self.lock_retries = 0  # DoPuts sent again after waiting past the gateway's lock wait
        self.left_at_stop = 0  # DoPuts refused for a lock when the run ended: not sent again
        self.commit_s: list[float] = []
        self.read_s: list[float] = []
        self.commit_end: list[float] = []  # when each commit and read ended (perf_counter)
        self.read_end: list[float] = []

    def client(self, n: int) -> HarnessClient:
        first = n % len(self.uris)  # spread clients over the replicas
        order = self.uris[first:] + self.uris[:first]
        return HarnessClient(order[0], replicas=order[1:], failover_s=60)

    def write(self, n: int) -> None:
        region = self.regions[n % len(self.regions)]
        with self.client(n) as client:
            for i in range(10**6):
                if self.stop.is_set():
                    return
                first = self.first_id + (n * 10**6 + i) * self.batch
                started = time.perf_counter()
                try:
                    if not self._put(client, region, first):
                        return
                except Exception as e:  # failover gave up
                    self.errors.append(f"writer {n}: {type(e).__name__}: {e}")
                    return
                ended = time.perf_counter()
                with self.lock:
                    self.commit_s.append(ended - started)
                    self.commit_end.append(ended)
                    self.firsts.append(first)

    def _put(self, client: HarnessClient, region: str, first: int) -> bool:
        """One DoPut, sent again with its commit id when its sources stayed locked past the
        gateway's wait (LockUnavailable: nothing was written), as a writer should; False when
        the run ended meanwhile (a writer shutting down: its rows were never acknowledged)."""
        from flight_gateway.protocol.errors import LockUnavailable

        commit_id = uuid.uuid4().hex
        while True:
            try:
                client.put("t", rows(region, first, self.batch), source=region, commit_id=commit_id)
                return True
            except LockUnavailable:
                with self.lock:
                    if self.stop.is_set():
                        self.left_at_stop += 1
                        return False
                    self.lock_retries += 1

    @property
    def acked_rows(self) -> int:
        with self.lock:
            return len(self.firsts) * self.batch

    @property
    def acked(self) -> set[int]:
        """Every acknowledged id."""
        return {int(i) for i in self.acked_ids()}

    def acked_ids(self) -> np.ndarray:
        """Every acknowledged id, sorted: batches never overlap, so sorting their first ids
        sorts them all."""
        with self.lock:
            firsts = np.sort(np.array(self.firsts, dtype=np.int64))
        return (firsts[:, None] + np.arange(self.batch, dtype=np.int64)).ravel()

    def read(self, n: int) -> None:
        with self.client(n) as client:
            while not self.stop.is_set():
                before = self.acked_ids()
                started = time.perf_counter()
                try:
                    ids = client.read("t", columns=["id"]).column("id")
                except Exception as e:
                    self.errors.append(f"reader {n}: {type(e).__name__}: {e}")
                    return
                ended = time.perf_counter()
                if problem := check_ids(before, ids):
                    self.errors.append(f"reader {n}: {problem}")
                with self.lock:
                    self.read_s.append(ended - started)
                    self.read_end.append(ended)

    def window(self, start: float, end: float) -> dict[str, float]:
        """Reads and commits that ended between ``start`` and ``end`` (perf_counter): read
        p50 (s), reads per minute, commits/s."""
        with self.lock:
            reads = [s for s, t in zip(self.read_s, self.read_end, strict=True) if start <= t < end]
            commits = sum(start <= t < end for t in self.commit_end)
        span = max(end - start, 1e-9)
        return {
            "read p50 s": round(statistics.median(reads), 2) if reads else float("nan"),
            "reads/min": round(len(reads) * 60 / span, 1),
            "commits/s": round(commits / span, 2),
        }

    def run(self, writers: int, readers: int) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.write, args=(n,)) for n in range(writers)]
        threads += [threading.Thread(target=self.read, args=(n,)) for n in range(readers)]
        for t in threads:
            t.start()
        return threads

    def finish(self, threads: list[threading.Thread]) -> None:
        self.stop.set()
        for t in threads:
            t.join(180)


def lost_and_doubled(expected: np.ndarray, ids: pa.ChunkedArray) -> tuple[int, int]:
    """(acknowledged ids missing, rows read twice) of a read's ids against the sorted ids
    acknowledged before it began. Vectorised: a reader's check of a large table would otherwise
    take more CPU than the gateway's read it checks, on the same cores, and more as the table
    grows. One sort of the read's ids, then neighbours (rows twice) and a binary search of each
    expected id: ``np.unique`` (hashing) and ``np.setdiff1d`` (another sort) took 220 ms of CPU
    per check of 0.5 M ids against 35 ms, and the 16 readers' checks were a third of the two
    cores' samples under ``bench_chaos``'s failover load (perf, 2026-12-04)."""
    got = np.sort(ids.to_numpy())
    twice = int(np.count_nonzero(got[1:] == got[:-1]))
    at = np.searchsorted(got, expected)
    inside = at < len(got)
    found = np.zeros(len(expected), dtype=bool)
    found[inside] = got[at[inside]] == expected[inside]
    return int(len(expected) - np.count_nonzero(found)), twice


def check_ids(expected: np.ndarray, ids: pa.ChunkedArray) -> str | None:
    """What is wrong with a read (``lost_and_doubled``), in words; None when nothing is."""
    missing, twice = lost_and_doubled(expected, ids)
    problems = [f"{twice} rows twice"] if twice else []
    if missing:
        problems.append(f"{missing} acknowledged rows missing")
    return ", ".join(problems) or None


def percentile_ms(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] * 1000 if values else float("nan")
    return statistics.quantiles(values, n=100)[q - 1] * 1000
