"""Read throughput: the gateway against direct access, in the same run.

1. DoGet of a Parquet ``files`` source through the gateway vs a bare pyarrow Flight server
   streaming the same Parquet file with a dataset scanner (goal: >= 0.9 of bare).
2. An Iceberg table read through the gateway with the client's parallel endpoints vs
   ``pyiceberg`` ``scan().to_arrow()`` directly (goal: >= 1.0).
Data is written before timing; each case is timed as the best of ``repeats`` runs.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.flight as fl
import pyarrow.parquet as pq

from clients import HarnessClient
from flight_gateway.app import GatewayConfig, HarnessFlightServer
from flight_gateway.catalog import Catalog


def _data(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "a": rng.integers(0, 1_000_000, rows),
            "b": rng.integers(0, 1_000_000, rows),
            "c": rng.random(rows),
        }
    )


class BareServer(fl.FlightServerBase):
    def __init__(self, path: str) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.path = path

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        reader = ds.dataset(self.path, format="parquet").scanner(batch_size=64 * 1024).to_reader()
        return fl.RecordBatchStream(reader)


def _best(fn: Callable[[], int], repeats: int) -> tuple[float, int]:
    best, n = float("inf"), 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = fn()
        best = min(best, time.perf_counter() - t0)
    return best, n


def _serve(server: fl.FlightServerBase) -> threading.Thread:
    t = threading.Thread(target=server.serve, daemon=True)
    t.start()
    return t


def run(quick: bool = False) -> list[dict]:
    rows = 2_000_000 if quick else 16_000_000
    repeats = 3 if quick else 5
    out: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        data = _data(rows)
        nbytes = data.nbytes
        pq.write_table(data, tmp / "data.parquet", row_group_size=256 * 1024)

        catalog = Catalog(f"sqlite:///{tmp / 'catalog.db'}")
        gw = HarnessFlightServer(
            catalog, GatewayConfig(port=0, allow_anonymous=True, ticket_key="bench-ticket-key-0123")
        )
        bare = BareServer(str(tmp / "data.parquet"))
        _serve(gw), _serve(bare)
        client = HarnessClient(f"grpc://127.0.0.1:{gw.port}")
        client.create_table(
            "t",
            [
                {"name": n, "type": str(t)}
                for n, t in zip(data.schema.names, data.schema.types, strict=True)
            ],
        )
        client.add_source(
            "t",
            "f",
            "files",
            config={"root": str(tmp), "target_task_bytes": 1 << 40},
            state={"files": ["data.parquet"]},
        )

        raw_gw = fl.connect(f"grpc://127.0.0.1:{gw.port}")
        raw_bare = fl.connect(f"grpc://127.0.0.1:{bare.port}")

        def via_gateway() -> int:
            info = raw_gw.get_flight_info(fl.FlightDescriptor.for_path("t"))
            return sum(raw_gw.do_get(ep.ticket).read_all().num_rows for ep in info.endpoints)

        def via_bare() -> int:
            return raw_bare.do_get(fl.Ticket(b"x")).read_all().num_rows

        t_bare, n1 = _best(via_bare, repeats)
        t_gw, n2 = _best(via_gateway, repeats)
        assert n1 == n2 == rows
        out.append(
            {
                "case": f"DoGet parquet {rows:,} rows, bare Flight",
                "value": round(nbytes / t_bare / 1e9, 3),
                "unit": "GB/s",
                "ratio": 1.0,
                "ratio_vs": "bare Flight",
            }
        )
        out.append(
            {
                "case": f"DoGet parquet {rows:,} rows, gateway",
                "value": round(nbytes / t_gw / 1e9, 3),
                "unit": "GB/s",
                "ratio": round(t_bare / t_gw, 3),
                "ratio_vs": "bare Flight",
            }
        )

        # Iceberg: several data files so the gateway has endpoints to fetch in parallel.
        from pyiceberg.catalog.sql import SqlCatalog

        (tmp / "wh").mkdir()
        props = {"uri": f"sqlite:///{tmp / 'ice.db'}", "warehouse": f"file://{tmp / 'wh'}"}
        ice = SqlCatalog("default", **props)
        ice.create_namespace("db")
        itable = ice.create_table("db.t", schema=data.schema)
        parts = 8
        step = rows // parts
        for i in range(parts):
            itable.append(data.slice(i * step, step))
        snap = itable.current_snapshot().snapshot_id
        client.create_table(
            "ice",
            [
                {"name": n, "type": str(t)}
                for n, t in zip(data.schema.names, data.schema.types, strict=True)
            ],
        )
        client.add_source(
            "ice",
            "i",
            "iceberg",
            config={"catalog": {"type": "sql", **props}, "identifier": "db.t"},
            state={"snapshot_id": snap},
        )

        def direct() -> int:
            return ice.load_table("db.t").scan(snapshot_id=snap).to_arrow().num_rows

        def gateway_parallel() -> int:
            return client.read("ice").num_rows

        t_direct, n3 = _best(direct, repeats)
        t_gwi, n4 = _best(gateway_parallel, repeats)
        assert n3 == n4 == step * parts
        ibytes = data.slice(0, step * parts).nbytes
        out.append(
            {
                "case": f"Iceberg {step * parts:,} rows, pyiceberg to_arrow",
                "value": round(ibytes / t_direct / 1e9, 3),
                "unit": "GB/s",
                "ratio": 1.0,
                "ratio_vs": "pyiceberg to_arrow",
            }
        )
        out.append(
            {
                "case": f"Iceberg {step * parts:,} rows, gateway parallel endpoints",
                "value": round(ibytes / t_gwi / 1e9, 3),
                "unit": "GB/s",
                "ratio": round(t_direct / t_gwi, 3),
                "ratio_vs": "pyiceberg to_arrow",
            }
        )

        client.close()
        raw_gw.close()
        raw_bare.close()
        gw.shutdown()
        bare.shutdown()
        catalog.close()
    return out
