"""Writers and compaction together (DESIGN §18: maintenance is optimistic).

Four writers put 100-row batches into a files source of millions of rows (full: 20 M; quick:
1 M) through a gateway process on a PostgreSQL catalog, first alone, then while a compaction
(``benchmarks.compaction.compact``: read the pinned rows, write one Parquet file, commit it
with ``read_version``) rewrites the source in a loop. Reported: the writers' commit p50 / p99
alone and during compaction, a rewrite's duration, the two ratios the design asks for (p99
during compaction against a rewrite's length: <= 0.5; against p99 alone: <= 2) and rows lost
or doubled (every id written read back once). Before §18 a compaction held the source's write
lock for its whole rewrite and a writer's p99 was a rewrite's length.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.compaction import compact
from benchmarks.processes import GatewayProcess
from benchmarks.services import postgres_database
from clients import HarnessClient

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.int64())])
COLUMNS = [{"name": "id", "type": "int64", "nullable": False}, {"name": "v", "type": "int64"}]
WRITERS, BATCH = 4, 100


def _rows(first: int, n: int) -> pa.Table:
    ids = np.arange(first, first + n, dtype=np.int64)
    return pa.table({"id": ids, "v": ids % 1000}, schema=SCHEMA)


def _seed(root: Path, rows: int, files: int) -> list[str]:
    """The source's first files: ``rows`` ids 0.. in ``files`` Parquet files."""
    root.mkdir(parents=True)
    names, per = [], rows // files
    for i in range(files):
        name = f"seed-{i}.parquet"
        pq.write_table(_rows(i * per, per), root / name)
        names.append(name)
    return names


class Writers:
    """``WRITERS`` threads putting ``BATCH``-row batches of fresh ids until stopped."""

    def __init__(self, uri: str, first_id: int) -> None:
        self.uri, self.next_id = uri, first_id
        self.latencies: list[float] = []
        self.written: list[int] = []
        self.errors: list[Exception] = []
        self.lock, self.stop = threading.Lock(), threading.Event()

    def _take(self) -> int:
        with self.lock:
            first, self.next_id = self.next_id, self.next_id + BATCH
            return first

    def _one(self) -> None:
        with HarnessClient(self.uri) as client:
            while not self.stop.is_set():
                first = self._take()
                t0 = time.perf_counter()
                try:
                    client.put("t", _rows(first, BATCH))
                except Exception as e:
                    self.errors.append(e)
                    continue
                with self.lock:
                    self.latencies.append(time.perf_counter() - t0)
                    self.written.append(first)

    def run_for(self, seconds: float, during: Any = None) -> None:
        self.stop.clear()
        self.latencies = []
        threads = [threading.Thread(target=self._one) for _ in range(WRITERS)]
        for t in threads:
            t.start()
        if during is None:
            time.sleep(seconds)
        else:
            during(seconds)
        self.stop.set()
        for t in threads:
            t.join(300)


def _quantiles(values: list[float]) -> tuple[float, float]:
    arr = np.asarray(values)
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def _compacting(uri: str, rewrites: list[float]) -> Any:
    """Rewrite the source in a loop for ``seconds`` (the last rewrite runs to its end)."""

    def loop(seconds: float) -> None:
        end = time.monotonic() + seconds
        with HarnessClient(uri) as client:
            while time.monotonic() < end:
                t0 = time.perf_counter()
                compact(client, "t", "f", SCHEMA)
                rewrites.append(time.perf_counter() - t0)

    return loop


def _lost_doubled(client: HarnessClient, seed_rows: int, written: list[int]) -> tuple[int, int]:
    ids = client.read("t", columns=["id"]).column("id")
    expected = seed_rows + BATCH * len(written)
    distinct = pc.count_distinct(ids).as_py()
    return expected - distinct, len(ids) - distinct


def run(quick: bool = False) -> Iterator[dict[str, Any]]:
    seed_rows, seconds = (1_000_000, 10.0) if quick else (20_000_000, 60.0)
    with postgres_database() as dsn, TemporaryDirectory() as tmp:
        if dsn is None:
            yield {"case": "writers during compaction: skipped (no PostgreSQL)", "value": 0}
            return
        root = Path(tmp)
        files = _seed(root / "files", seed_rows, 20)
        gw = GatewayProcess(dsn, root)
        gw.start()
        try:
            yield from _measure(gw.uri, root, files, seed_rows, seconds)
        finally:
            gw.stop()


def _measure(
    uri: str, root: Path, files: list[str], seed_rows: int, seconds: float
) -> Iterator[dict[str, Any]]:
    with HarnessClient(uri) as client:
        client.create_table("t", COLUMNS)
        client.add_source("t", "f", "files", config={"root": str(root / "files")},
                          state={"files": files})  # fmt: skip
        writers = Writers(uri, first_id=10**12)
        writers.run_for(seconds)
        alone = _quantiles(writers.latencies)
        rewrites: list[float] = []
        writers.run_for(seconds, during=_compacting(uri, rewrites))
        during = _quantiles(writers.latencies)
        lost, doubled = _lost_doubled(client, seed_rows, writers.written)
    if writers.errors or lost or doubled:
        raise AssertionError(f"{lost} lost, {doubled} doubled, errors {writers.errors[:3]}")
    rewrite = statistics.median(rewrites)
    label = f"{WRITERS} writers x {BATCH} rows into {seed_rows / 1e6:g} M rows"
    yield {"case": f"{label}: commit alone", "value": round(alone[0], 4), "unit": "s",
           "p50_ms": round(alone[0] * 1e3, 1), "p99_ms": round(alone[1] * 1e3, 1)}  # fmt: skip
    yield {"case": f"{label}: commit during compaction", "value": round(during[0], 4),
           "unit": "s", "p50_ms": round(during[0] * 1e3, 1),
           "p99_ms": round(during[1] * 1e3, 1)}  # fmt: skip
    yield {"case": f"compaction of {seed_rows / 1e6:g} M rows: one rewrite (median)",
           "value": round(rewrite, 3), "unit": "s", "rewrites": len(rewrites)}  # fmt: skip
    yield {"case": "writer p99 during compaction / a rewrite's length", "value":
           round(during[1] / rewrite, 3), "unit": "x", "ratio": round(during[1] / rewrite, 3),
           "ratio_vs": "a rewrite's median length (goal <= 0.5)"}  # fmt: skip
    yield {"case": "writer p99 during compaction / p99 alone", "value":
           round(during[1] / alone[1], 3), "unit": "x", "ratio": round(during[1] / alone[1], 3),
           "ratio_vs": "writers alone (goal <= 2)"}  # fmt: skip
    yield {"case": "writers during compaction: rows lost / doubled", "value": lost + doubled,
           "unit": "rows", "lost": lost, "doubled": doubled}  # fmt: skip
