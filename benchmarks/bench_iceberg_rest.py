"""The Iceberg REST face: DuckDB's iceberg extension reading lineitem (TPC-H) through the
gateway's REST catalog vs DuckDB on the same Parquet files, in the same run; the first load of
a version (materializing it once) is reported on its own."""

from __future__ import annotations

import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from benchmarks.tpch_tables import generate
from clients import HarnessClient
from flight_gateway.catalog import Catalog
from flight_gateway.server import GatewayConfig, HarnessFlightServer

QUERY = "SELECT l_returnflag, sum(l_quantity), sum(l_extendedprice), count(*) FROM {t} GROUP BY 1"


def _duck() -> Any:
    import duckdb
    import duckdb_extensions

    con = duckdb.connect(config={"autoinstall_known_extensions": "false"})
    for name in ("httpfs", "avro", "iceberg"):
        duckdb_extensions.import_extension(name, con=con)
        con.load_extension(name)
    return con


def _best(fn: Any, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def run(quick: bool = False) -> Iterator[dict[str, Any]]:
    sf = 0.1 if quick else 1.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lineitem = generate(sf).execute("SELECT * FROM lineitem").to_arrow_table()
        (root / "f").mkdir()
        parts = 8
        step = -(-lineitem.num_rows // parts)
        for i in range(parts):
            pq.write_table(lineitem.slice(i * step, step), root / "f" / f"part-{i}.parquet")
        catalog = Catalog(f"sqlite:///{root / 'c.db'}")
        config = GatewayConfig(port=0, allow_anonymous=True, ticket_key="bench-ticket-key-0123", iceberg_rest_port=0, iceberg_rest_dir=str(root / "rest"))  # fmt: skip
        server = HarnessFlightServer(catalog, config)
        threading.Thread(target=server.serve, daemon=True).start()
        client = HarnessClient(f"grpc://127.0.0.1:{server.port}")
        try:
            cols = [{"name": f.name, "type": str(f.type)} for f in lineitem.schema]
            client.create_table("lineitem", cols)
            names = [f"part-{i}.parquet" for i in range(parts)]
            client.add_source("lineitem", "f", "files", config={"root": str(root / "f")}, state={"files": names})  # fmt: skip
            con = _duck()
            uri = f"http://127.0.0.1:{server.rest.port}"
            direct = QUERY.format(t=f"read_parquet('{root / 'f'}/*.parquet')")
            via = QUERY.format(t="h.harness.lineitem")
            # First load of the version (materializes it), before DuckDB's transaction: DuckDB
            # refuses metadata written after its transaction began (docs/engines.md).
            started = time.perf_counter()
            urllib.request.urlopen(f"{uri}/v1/namespaces/harness/tables/lineitem").read()
            first_s = time.perf_counter() - started
            con.execute(f"ATTACH 'harness' AS h (TYPE iceberg, ENDPOINT '{uri}', AUTHORIZATION_TYPE 'none')")  # fmt: skip
            first = con.execute(via).fetchall()
            assert sorted(first) == sorted(con.execute(direct).fetchall())
            t_direct = _best(lambda: con.execute(direct).fetchall())
            t_rest = _best(lambda: con.execute(via).fetchall())
            n = lineitem.num_rows
            yield {"case": f"lineitem SF {sf:g} ({n:,} rows), DuckDB on the Parquet files", "value": round(n / t_direct), "unit": "rows/s", "ratio": 1.0, "ratio_vs": "DuckDB on Parquet"}  # fmt: skip
            yield {"case": f"lineitem SF {sf:g}, DuckDB via the gateway's Iceberg REST catalog", "value": round(n / t_rest), "unit": "rows/s", "ratio": round(t_direct / t_rest, 3), "ratio_vs": "DuckDB on Parquet"}  # fmt: skip
            yield {"case": f"lineitem SF {sf:g}, first load of the version (materialized by the gateway)", "value": round(first_s, 2), "unit": "s"}  # fmt: skip
            con.close()
        finally:
            client.close()
            server.shutdown()
            catalog.close()
