"""Hudi reads through the gateway against hudi-rs alone on the same table.

Spark with Hudi's own Spark bundle (``flight_gateway.local.hudi``) writes two tables of the same
rows in several commits: a copy-on-write one, and a merge-on-read one where a later upsert of a
slice of the keys left log files, so its reads merge. Each is read whole, best of ``repeats``:
by hudi-rs directly (``HudiTable.read`` of the table's columns, all file slices at the instant), through the gateway
with the client's parallel endpoints, and (copy-on-write) with direct tasks the client reads
itself. The rows are checked equal in count, and the merged table's sum of ``c`` against
hudi-rs's.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.bench_gateway_read import _best, _data
from clients import HarnessClient
from flight_gateway.app import GatewayConfig, HarnessFlightServer
from flight_gateway.catalog import Catalog
from flight_gateway.local.hudi import COW, MOR, HudiSpark

PARTS = 4


def _write(spark: HudiSpark, uri: str, data: pa.Table, table_type: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    step = data.num_rows // PARTS
    instant = ""
    for i in range(PARTS):
        instant = spark.write(
            uri, data.slice(i * step, step), operation="bulk_insert", table_type=table_type
        )
    if table_type == MOR:  # updates of every 20th key: log files on most file groups
        changed = data.take(pa.array(range(0, data.num_rows, 20)))
        changed = changed.set_column(3, "c", pc.add(changed.column("c"), 1.0))
        instant = spark.write(uri, changed, operation="upsert", table_type=table_type)
    return instant, time.perf_counter() - t0


def _hudi_rs(uri: str, instant: str, columns: list[str]) -> pa.Table:
    """hudi-rs's own read of the instant, of the table's columns (not Hudi's meta columns,
    which the gateway does not return either)."""
    from hudi import HudiReadOptions, HudiTable

    options = HudiReadOptions(projection=columns).with_as_of_timestamp(instant)
    return pa.Table.from_batches(HudiTable(uri).read(options))


def _row(case: str, nbytes: int, seconds: float, base: float) -> dict:
    return {
        "case": case,
        "value": round(nbytes / seconds / 1e9, 3),
        "unit": "GB/s",
        "ratio": round(base / seconds, 3),
        "ratio_vs": "hudi-rs HudiTable.read",
    }


def _case(
    spark: HudiSpark,
    client: HarnessClient,
    tmp: Path,
    data: pa.Table,
    table_type: str,
    label: str,
    repeats: int,
) -> list[dict]:
    rows, nbytes, columns = data.num_rows, data.nbytes, data.column_names
    uri = str(tmp / label.split()[0])
    instant, write_s = _write(spark, uri, data, table_type)
    name = label.split()[0].replace("-", "_")
    client.create_table(name, [{"name": f.name, "type": str(f.type)} for f in data.schema])
    client.add_source(name, "h", "hudi", config={"uri": uri, "direct": True},
                      state={"instant": instant})  # fmt: skip
    t_lib, n0 = _best(lambda: _hudi_rs(uri, instant, columns).num_rows, repeats)
    t_gw, n1 = _best(lambda: client.read(name).num_rows, repeats)
    assert n0 == n1 == rows, (n0, n1, rows)
    base = f"Hudi {label}, {rows:,} rows"
    out = [
        _row(f"{base}, hudi-rs alone", nbytes, t_lib, t_lib),
        _row(f"{base}, gateway parallel endpoints", nbytes, t_gw, t_lib),
    ]
    if table_type == COW:
        t_dir, n2 = _best(lambda: client.read(name, direct=True).num_rows, repeats)
        assert n2 == rows
        out.append(_row(f"{base}, direct tasks", nbytes, t_dir, t_lib))
    else:  # the merged values, not only the count
        want = pc.sum(_hudi_rs(uri, instant, columns).column("c")).as_py()
        got = pc.sum(client.read(name).column("c")).as_py()
        assert abs(want - got) < 1e-6 * abs(want), (want, got)
    out.append({"case": f"{base}, Spark write (not timed against)", "value": round(write_s, 1),
                "unit": "s"})  # fmt: skip
    return out


def run(quick: bool = False) -> list[dict]:
    rows = 2_000_000 if quick else 8_000_000
    repeats = 3 if quick else 5
    out: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp_s, HudiSpark() as spark:
        tmp = Path(tmp_s)
        data = _data(rows)
        catalog = Catalog(f"sqlite:///{tmp / 'catalog.db'}")
        server = HarnessFlightServer(
            catalog, GatewayConfig(port=0, allow_anonymous=True, ticket_key="bench-ticket-key-0123")
        )
        threading.Thread(target=server.serve, daemon=True).start()
        client = HarnessClient(f"grpc://127.0.0.1:{server.port}")
        for table_type, label in ((COW, "copy-on-write"), (MOR, "merge-on-read with logs")):
            out += _case(spark, client, tmp, data, table_type, label, repeats)
        client.close()
        server.shutdown()
        catalog.close()
    return out
