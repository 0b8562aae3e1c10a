"""Soak: a union table fed by a mover for N minutes must read as fast at the end as at the start.

One in-process gateway over a Postgres catalog (SQLite when Postgres is unreachable) serves a
table of two sources: ``k0`` (a Kafka partition) and ``ice`` (an Iceberg table). For N minutes:

- a producer appends small batches to ``k0`` with DoPut (two catalog versions each: the intent
  and the commit);
- a ``Mover`` moves ``k0``'s rows to ``ice`` every ``MOVE_S`` (one Iceberg
  snapshot, one data file and one manifest each, one catalog version);
- readers plan (GetFlightInfo) and fetch (DoGet) the whole table in a loop;
- maintenance (``flight_gateway.core.maintenance.run_once``) runs every ``MAINT_S`` with the table's
  ``retention.keep_last`` property set, and a compaction rewrites ``ice`` as one file every
  ``COMPACT_S`` through the engine-write actions (``begin_write``/``commit_write`` with
  ``overwrite`` and ``relocation``: what ``pipelines.spark_jobs.compact`` does, with pyarrow).

Reported: read p50 (plan + fetch) in the first and the last window (goal: end within 1.5x of
start), plan and fetch p50 each, RSS at both (goal: flat), reads per minute overall and in both
windows, and at the end the catalog versions (current and kept), Iceberg snapshots, manifests and
data files.

``--quick``: 1 minute. Full: ``HARNESS_SOAK_MINUTES`` (default 10). ``HARNESS_SOAK_KEEP_LAST``
(default 200; 0 sets no retention property) and ``HARNESS_SOAK_COMPACT_S`` (default 30; 0: never
compact) show what the soak does without them.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.compaction import compact
from benchmarks.services import postgres_database
from clients import HarnessClient
from flight_gateway.app import GatewayConfig, HarnessFlightServer
from flight_gateway.catalog import Catalog
from flight_gateway.local.kafka import local_broker

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
TABLE = "soak"
PUT_ROWS = 20
MOVE_S = 1.0
MAINT_S = 10.0
READERS = 2


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default


def _batch(start: int) -> pa.Table:
    ids = list(range(start, start + PUT_ROWS))
    return pa.table(
        {"id": ids, "name": [f"name-{i}" for i in ids], "amount": [i * 0.25 for i in ids]},
        schema=SCHEMA,
    )


def _iceberg_shape(ice_props: dict[str, str]) -> dict[str, int]:
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("default", **{k: v for k, v in ice_props.items() if k != "type"})
    table = cat.load_table("db.soak")
    snap = table.current_snapshot()
    manifests = snap.manifests(table.io) if snap else []
    return {
        "snapshots": len(table.metadata.snapshots),
        "manifests": len(manifests),
        "files": sum((m.added_files_count or 0) + (m.existing_files_count or 0) for m in manifests),
    }


class _Soak:
    def __init__(self, uri: str, catalog: Catalog, bootstrap: str, ice_props: dict[str, str]):
        self.uri, self.catalog, self.ice_props = uri, catalog, ice_props
        self.bootstrap = bootstrap
        self.stop = threading.Event()
        #: (finished at, plan s, fetch s, rows read)
        self.reads: list[tuple[float, float, float, int]] = []
        self.rss: list[tuple[float, float]] = []
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []
        self.t0 = time.perf_counter()

    def _loop(self, what: str, step: Any, pause: float = 0.0) -> None:
        while not self.stop.is_set():
            try:
                step()
            except Exception as e:  # counted and reported; a soak keeps going
                self.counts[f"{what}_errors"] += 1
                if len(self.errors) < 5:
                    self.errors.append(f"{what}: {e}")
            if pause:
                self.stop.wait(pause)

    def producer(self) -> None:
        client, at = HarnessClient(self.uri), [0]

        def step() -> None:
            client.put(TABLE, _batch(at[0]), source="k0")
            at[0] += PUT_ROWS
            self.counts["puts"] += 1

        self._loop("put", step)

    def mover(self) -> None:
        from pipelines.mover import Mover

        mover = Mover(HarnessClient(self.uri), TABLE, "k0", "ice")

        def step() -> None:
            self.counts["moves"] += mover.run_once().version is not None

        self._loop("move", step, MOVE_S)

    def reader(self) -> None:
        client = HarnessClient(self.uri)

        def step() -> None:
            t0 = time.perf_counter()
            info = client.flight_info(TABLE)
            t1 = time.perf_counter()
            rows = sum(client.fetch_endpoint(ep).num_rows for ep in info.endpoints)
            t2 = time.perf_counter()
            self.reads.append((t2 - self.t0, t1 - t0, t2 - t1, rows))

        self._loop("read", step)

    def maintenance(self, compact_s: float) -> None:
        from flight_gateway.core.maintenance import run_once

        client = HarnessClient(self.uri)
        last_compaction = [time.perf_counter()]

        def step() -> None:
            report = run_once(self.catalog, grace_s=0)
            self.counts["maintenance_runs"] += 1
            self.counts["expired_versions"] += sum(report.expired_versions.values())
            self.counts["expired_snapshots"] += sum(report.expired.values())
            if compact_s and time.perf_counter() - last_compaction[0] >= compact_s:
                compact(client, TABLE, "ice", SCHEMA)  # one file, one relocation commit
                last_compaction[0] = time.perf_counter()
                self.counts["compactions"] += 1

        self.stop.wait(MAINT_S)
        self._loop("maintenance", step, MAINT_S)

    def run(self, seconds: float, compact_s: float) -> None:
        threads = [
            threading.Thread(target=self.producer, daemon=True),
            threading.Thread(target=self.mover, daemon=True),
            threading.Thread(target=self.maintenance, args=(compact_s,), daemon=True),
        ] + [threading.Thread(target=self.reader, daemon=True) for _ in range(READERS)]
        for t in threads:
            t.start()
        self.t0 = time.perf_counter()
        while not self.stop.wait(1.0):
            now = time.perf_counter() - self.t0
            self.rss.append((now, _rss_mb()))
            if now >= seconds:
                self.stop.set()
        for t in threads:
            t.join(60)


def _window(reads: list[tuple[float, float, float, int]], lo: float, hi: float) -> dict[str, float]:
    sel = [r for r in reads if lo <= r[0] < hi]
    if not sel:
        nan = float("nan")
        return {"reads": 0, "p50": nan, "plan": nan, "fetch": nan, "rows": nan, "us_per_row": nan}
    return {
        "reads": len(sel),
        "p50": 1000 * statistics.median(r[1] + r[2] for r in sel),
        "plan": 1000 * statistics.median(r[1] for r in sel),
        "fetch": 1000 * statistics.median(r[2] for r in sel),
        "rows": statistics.median(r[3] for r in sel),
        # The table grows as the producer appends: fetch time per row read separates what
        # more data costs from what history would.
        "us_per_row": 1e6 * statistics.median(r[2] / max(1, r[3]) for r in sel),
        "per_min": len(sel) * 60 / (hi - lo),
    }


def _series(soak: _Soak, seconds: float) -> dict[str, list[float]]:
    """Read p50 and RSS per time bucket, for the chart of the run (benchmarks.charts)."""
    width = max(5.0, seconds / 30)
    out: dict[str, list[float]] = {"t_s": [], "read_p50_ms": [], "rss_mb": []}
    t = 0.0
    while t < seconds:
        window = _window(soak.reads, t, t + width)
        out["t_s"].append(round(t + width / 2, 1))
        out["read_p50_ms"].append(round(window["p50"], 2))
        out["rss_mb"].append(round(_rss_at(soak.rss, t, t + width), 1))
        t += width
    return out


def _rss_at(rss: list[tuple[float, float]], lo: float, hi: float) -> float:
    vals = [m for t, m in rss if lo <= t < hi]
    return statistics.median(vals) if vals else float("nan")


def run(quick: bool = False) -> list[dict]:
    minutes = 1.0 if quick else _env_float("HARNESS_SOAK_MINUTES", 10.0)
    keep_last = int(_env_float("HARNESS_SOAK_KEEP_LAST", 200))
    compact_s = _env_float("HARNESS_SOAK_COMPACT_S", 30.0)
    seconds = minutes * 60
    # Start and end windows: the first and the last sixth of the run (10 s in quick mode), the
    # start window after a short warm-up so that first-call costs do not flatter the ratio.
    width = max(10.0, seconds / 6)
    warm = min(10.0, seconds / 12)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        dsn = stack.enter_context(postgres_database())
        catalog_url = dsn or f"sqlite:///{tmp / 'catalog.db'}"
        bootstrap = stack.enter_context(local_broker())

        from confluent_kafka.admin import AdminClient, NewTopic
        from pyiceberg.catalog.sql import SqlCatalog

        topic = f"soak-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
            f.result(30)
        (tmp / "warehouse").mkdir()
        ice_props = {
            "type": "sql",
            "uri": f"sqlite:///{tmp / 'iceberg.db'}",
            "warehouse": f"file://{tmp / 'warehouse'}",
        }
        icat = SqlCatalog("default", **{k: v for k, v in ice_props.items() if k != "type"})
        icat.create_namespace_if_not_exists("db")
        icat.create_table("db.soak", schema=SCHEMA)

        catalog = Catalog(catalog_url)
        stack.callback(catalog.close)
        server = HarnessFlightServer(
            catalog,
            GatewayConfig(
                catalog=catalog_url,
                port=0,
                allow_anonymous=True,
                ticket_key="bench-ticket-key-0123",
            ),
        )
        threading.Thread(target=server.serve, daemon=True).start()
        stack.callback(server.shutdown)
        uri = f"grpc://127.0.0.1:{server.port}"
        client = HarnessClient(uri)
        stack.callback(client.close)
        props = {"retention.keep_last": keep_last} if keep_last else None
        client.create_table(TABLE, SCHEMA, properties=props)
        client.add_source(
            TABLE,
            "k0",
            "kafka",
            config={"bootstrap_servers": bootstrap, "topic": topic, "partition": 0},
            state={"low": 0, "high": 0},
        )
        client.add_source(
            TABLE,
            "ice",
            "iceberg",
            config={"catalog": ice_props, "identifier": "db.soak"},
            state={"snapshot_id": None},
        )

        soak = _Soak(uri, catalog, bootstrap, ice_props)
        soak.run(seconds, compact_s)

        start = _window(soak.reads, warm, warm + width)
        end = _window(soak.reads, seconds - width, seconds + 1)
        rss0, rss1 = (
            _rss_at(soak.rss, warm, warm + width),
            _rss_at(soak.rss, seconds - width, seconds + 1),
        )
        desc = client.describe(TABLE)
        kept = len(client.history(TABLE))
        ice = _iceberg_shape(ice_props)

    compaction = f"every {compact_s:g}s" if compact_s else "none"
    label = (
        f"{minutes:g} min, {'Postgres' if dsn else 'SQLite'} catalog, "
        f"keep_last={keep_last or 'none'}, compaction={compaction}"
    )
    c = soak.counts
    errors = sum(v for k, v in c.items() if k.endswith("_errors"))
    common: dict[str, Any] = {"failed": errors} if errors else {}
    if soak.errors:
        common["failures"] = "; ".join(soak.errors)[:300]

    def ratio(a: float, b: float) -> float:
        return round(a / b, 3) if b and b == b and a == a else float("nan")

    return [
        {
            "case": f"soak read p50 start ({label})",
            "value": round(start["p50"], 2),
            "unit": "ms",
            "ratio": 1.0,
            "ratio_vs": "start",
            "p50_ms": round(start["p50"], 2),
        },
        {
            "case": f"soak read p50 end ({label})",
            "value": round(end["p50"], 2),
            "unit": "ms",
            "ratio": ratio(end["p50"], start["p50"]),
            "ratio_vs": "start (goal <= 1.5)",
            "p50_ms": round(end["p50"], 2),
            **common,
        },
        {
            "case": "soak plan (GetFlightInfo) p50 end",
            "value": round(end["plan"], 2),
            "unit": "ms",
            "ratio": ratio(end["plan"], start["plan"]),
            "ratio_vs": f"start ({start['plan']:.2f} ms)",
        },
        {
            "case": "soak fetch (DoGet) p50 end",
            "value": round(end["fetch"], 2),
            "unit": "ms",
            "ratio": ratio(end["fetch"], start["fetch"]),
            "ratio_vs": f"start ({start['fetch']:.2f} ms)",
        },
        {
            "case": f"soak fetch time per row read, end ({end['rows']:,.0f} rows a read)",
            "value": round(end["us_per_row"], 3),
            "unit": "us/row",
            "ratio": ratio(end["us_per_row"], start["us_per_row"]),
            "ratio_vs": f"start ({start['us_per_row']:.3f} us/row, {start['rows']:,.0f} rows)",
        },
        {
            "case": "soak RSS end",
            "value": round(rss1, 1),
            "unit": "MB",
            "ratio": ratio(rss1, rss0),
            "ratio_vs": f"start ({rss0:.1f} MB, goal flat)",
        },
        {
            "case": "soak reads per minute (whole run)",
            "value": round(len(soak.reads) / minutes),
            "unit": "reads/min",
            "ratio": ratio(end.get("per_min", 0.0), start.get("per_min", 0.0)),
            "ratio_vs": "end window / start window",
        },
        {
            "case": (
                f"soak at end: versions (kept {kept} of {desc.version + 1}); "
                f"{c['puts']} puts, {c['moves']} moves, {c['maintenance_runs']} maintenance runs, "
                f"{c['compactions']} compactions, {c['expired_versions']} versions and "
                f"{c['expired_snapshots']} snapshots expired"
            ),
            "value": desc.version,
            "unit": "version",
        },
        {
            "case": (
                f"soak at end: Iceberg data files ({ice['manifests']} manifests, "
                f"{ice['snapshots']} snapshots)"
            ),
            "value": ice["files"],
            "unit": "files",
        },
        {
            "case": "soak over time (read p50, RSS)",
            "value": round(minutes, 2),
            "unit": "min",
            "series": _series(soak, seconds),
        },
    ]


if __name__ == "__main__":
    import json
    import sys

    for row in run(quick="--quick" in sys.argv):
        print(json.dumps(row))
