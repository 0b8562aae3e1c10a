"""`make demo`: the gateway on embedded defaults, one table over Parquet + Iceberg + DuckLake.

Everything lives under ./demo-data: a SQLite harness catalog, Parquet files, a pyiceberg
SqlCatalog with a local warehouse, and a DuckLake with SQLite metadata. A gateway is started on
a free loopback port; pandas and Polars read through the Python client.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from clients import HarnessClient
from flight_gateway.catalog import Catalog
from flight_gateway.server import GatewayConfig, HarnessFlightServer
from planners.ducklake import connect as ducklake_connect

log = logging.getLogger("demo")
SCHEMA = pa.schema([("id", pa.int64()), ("level", pa.string()), ("msg", pa.string())])


def batch(start: int, n: int, level: str) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table(
        {"id": ids, "level": [level] * n, "msg": [f"{level.lower()} #{i}" for i in ids]},
        schema=SCHEMA,
    )


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("flight_gateway").setLevel(logging.WARNING)
    root = Path("demo-data").resolve()
    shutil.rmtree(root, ignore_errors=True)
    (root / "files").mkdir(parents=True)
    (root / "warehouse").mkdir()

    catalog = Catalog(f"sqlite:///{root / 'harness.db'}")
    config = GatewayConfig(
        catalog=catalog.url, port=0, allow_anonymous=True, ticket_key="demo-only-ticket-key"
    )
    server = HarnessFlightServer(catalog, config)
    threading.Thread(target=server.serve, daemon=True).start()
    client = HarnessClient(f"grpc://127.0.0.1:{server.port}")
    log.info("gateway listening on grpc://127.0.0.1:%d", server.port)

    # Cold data in three formats.
    pq.write_table(batch(0, 1000, "ERROR"), root / "files" / "part-0.parquet")
    from pyiceberg.catalog.sql import SqlCatalog

    ice_props = {
        "uri": f"sqlite:///{root / 'iceberg.db'}",
        "warehouse": f"file://{root / 'warehouse'}",
    }
    ice = SqlCatalog("default", **ice_props)
    ice.create_namespace("db")
    events = ice.create_table("db.events", schema=SCHEMA)
    events.append(batch(10_000, 500, "INFO"))
    lake_cfg = {
        "metadata": f"sqlite:{root / 'lake.sqlite'}",
        "data_path": f"{root / 'lake'}/",
        "table": "debug",
    }
    con = ducklake_connect(lake_cfg, read_only=False)
    con.execute("CREATE TABLE lake.debug (id BIGINT, level VARCHAR, msg VARCHAR)")
    con.execute(
        "INSERT INTO lake.debug SELECT i, 'DEBUG', 'debug #' || i FROM range(20000, 20200) r(i)"
    )
    lake_snapshot = con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0]
    con.close()

    client.create_table("logs", SCHEMA, partition_by=["level"])
    v1 = client.commit(
        "logs",
        add_sources=[
            {
                "name": "errors",
                "kind": "files",
                "partition": {"level": "ERROR"},
                "config": {"format": "parquet", "root": str(root / "files")},
                "state": {"files": ["part-0.parquet"]},
            },
            {
                "name": "info",
                "kind": "iceberg",
                "partition": {"level": "INFO"},
                "config": {"catalog": {"type": "sql", **ice_props}, "identifier": "db.events"},
                "state": {"snapshot_id": events.current_snapshot().snapshot_id},
            },
            {
                "name": "debug",
                "kind": "ducklake",
                "partition": {"level": "DEBUG"},
                "config": lake_cfg,
                "state": {"snapshot_id": lake_snapshot},
            },
        ],
    )
    log.info("version %d: table 'logs' = Parquet(ERROR) + Iceberg(INFO) + DuckLake(DEBUG)", v1)

    # A writer lands more data and commits the new file list and Iceberg snapshot at once.
    pq.write_table(batch(1000, 250, "ERROR"), root / "files" / "part-1.parquet")
    events.append(batch(10_500, 100, "INFO"))
    v2 = client.commit(
        "logs",
        updates=[
            {"source": "errors", "state": {"files": ["part-0.parquet", "part-1.parquet"]}},
            {"source": "info", "state": {"snapshot_id": events.current_snapshot().snapshot_id}},
        ],
    )
    log.info(
        "version %d: +250 ERROR rows (new Parquet file) and +100 INFO rows (new Iceberg snapshot)",
        v2,
    )

    df = client.to_pandas("logs")
    log.info(
        "\npandas, latest version: %d rows\n%s", len(df), df.groupby("level").size().to_string()
    )
    old = client.to_pandas("logs", version=v1)
    log.info(
        "\npandas, time travel to version %d: %d rows\n%s",
        v1,
        len(old),
        old.groupby("level").size().to_string(),
    )

    flt = "level IN ('ERROR', 'DEBUG') AND id BETWEEN 990 AND 1004"
    pl_df = client.to_polars("logs", columns=["id", "msg"], filter=flt)
    log.info("\nPolars, filter %r:\n%s", flt, pl_df)

    info = client.flight_info("logs", filter="level = 'INFO' AND id >= 10550")
    meta = json.loads(info.app_metadata)
    log.info(
        "\nsource pruning for level = 'INFO': %s",
        {s["name"]: "pruned" if s["pruned"] else f"{s['tasks']} task(s)" for s in meta["sources"]},
    )
    log.info("rows: %d", client.read("logs", filter="level = 'INFO' AND id >= 10550").num_rows)

    client.close()
    server.shutdown()
    catalog.close()


if __name__ == "__main__":
    main()
