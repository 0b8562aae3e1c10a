"""Delta and Paimon reads through the gateway against each library's own ``to_arrow``.

One table of each format, written in several commits (so there are files to read in parallel),
read whole: by the library directly (``DeltaTable.to_pyarrow_table()``, pypaimon's
``to_arrow``), through the gateway with the client's parallel endpoints, and with direct tasks
that the client reads itself (an unpartitioned Delta table; an append-only Paimon table).
Best of ``repeats``.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.bench_gateway_read import _best, _data
from clients import HarnessClient
from flight_gateway.app import GatewayConfig, HarnessFlightServer
from flight_gateway.catalog import Catalog

PARTS = 8


def _columns(data: pa.Table) -> list[dict[str, str]]:
    return [{"name": f.name, "type": str(f.type)} for f in data.schema]


def _delta(tmp: Path, data: pa.Table) -> tuple[str, int]:
    from deltalake import DeltaTable, write_deltalake

    uri = str(tmp / "delta")
    step = data.num_rows // PARTS
    for i in range(PARTS):
        write_deltalake(uri, data.slice(i * step, step), mode="append")
    return uri, DeltaTable(uri).version()


def _paimon(tmp: Path, data: pa.Table) -> tuple[Any, int]:
    from pypaimon import CatalogFactory, Schema

    logging.getLogger("pypaimon").setLevel(logging.WARNING)
    catalog = CatalogFactory.create({"warehouse": str(tmp / "paimon")})
    catalog.create_database("db", True)
    catalog.create_table("db.t", Schema.from_pyarrow_schema(data.schema), False)
    table = catalog.get_table("db.t")
    step = data.num_rows // PARTS
    for i in range(PARTS):
        builder = table.new_batch_write_builder()
        write, commit = builder.new_write(), builder.new_commit()
        write.write_arrow(data.slice(i * step, step))
        commit.commit(write.prepare_commit())
        write.close()
        commit.close()
    return table, table.snapshot_manager().get_latest_snapshot().id


def _rows(case: str, nbytes: int, seconds: float, base: float, vs: str) -> dict:
    return {
        "case": case,
        "value": round(nbytes / seconds / 1e9, 3),
        "unit": "GB/s",
        "ratio": round(base / seconds, 3),
        "ratio_vs": vs,
    }


def run(quick: bool = False) -> list[dict]:
    rows = 2_000_000 if quick else 16_000_000
    repeats = 3 if quick else 5
    out: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        data = _data(rows)
        nbytes = data.nbytes
        catalog = Catalog(f"sqlite:///{tmp / 'catalog.db'}")
        server = HarnessFlightServer(
            catalog, GatewayConfig(port=0, allow_anonymous=True, ticket_key="bench-ticket-key-0123")
        )
        threading.Thread(target=server.serve, daemon=True).start()
        client = HarnessClient(f"grpc://127.0.0.1:{server.port}")

        from deltalake import DeltaTable

        uri, version = _delta(tmp, data)
        client.create_table("d", _columns(data))
        config = {"uri": uri, "direct": True}
        client.add_source("d", "d", "delta", config=config, state={"version": version})
        t_lib, n0 = _best(lambda: DeltaTable(uri).to_pyarrow_table().num_rows, repeats)
        t_gw, n1 = _best(lambda: client.read("d").num_rows, repeats)
        t_dir, n2 = _best(lambda: client.read("d", direct=True).num_rows, repeats)
        assert n0 == n1 == n2 == rows
        vs = "deltalake to_pyarrow_table"
        out.append(_rows(f"Delta {rows:,} rows, {vs}", nbytes, t_lib, t_lib, vs))
        out.append(
            _rows(f"Delta {rows:,} rows, gateway parallel endpoints", nbytes, t_gw, t_lib, vs)
        )
        out.append(_rows(f"Delta {rows:,} rows, direct tasks", nbytes, t_dir, t_lib, vs))

        table, snap = _paimon(tmp, data)
        client.create_table("p", _columns(data))
        config = {"warehouse": str(tmp / "paimon"), "identifier": "db.t", "direct": True}
        client.add_source("p", "p", "paimon", config=config, state={"snapshot_id": snap})

        def paimon_itself() -> int:
            rb = table.new_read_builder()
            return int(rb.new_read().to_arrow(rb.new_scan().plan().splits()).num_rows)

        t_lib, n0 = _best(paimon_itself, repeats)
        t_gw, n1 = _best(lambda: client.read("p").num_rows, repeats)
        t_dir, n2 = _best(lambda: client.read("p", direct=True).num_rows, repeats)
        assert n0 == n1 == n2 == rows
        vs = "pypaimon to_arrow"
        out.append(_rows(f"Paimon {rows:,} rows, {vs}", nbytes, t_lib, t_lib, vs))
        out.append(
            _rows(f"Paimon {rows:,} rows, gateway parallel endpoints", nbytes, t_gw, t_lib, vs)
        )
        out.append(_rows(f"Paimon {rows:,} rows, direct tasks", nbytes, t_dir, t_lib, vs))
        client.close()
        server.shutdown()
        catalog.close()
    return out
