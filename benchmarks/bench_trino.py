"""Trino (476, from Maven Central) running the 22 TPC-H queries over the harness's Iceberg REST
face, against the same Trino over a plain Iceberg catalog (a file metastore with the tables
registered) of the very same Iceberg tables, in the same run; and Trino's scan rate of lineitem
through the face. Every answer is checked equal between the two catalogs."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks import tpch_tables as tpch
from clients import HarnessClient
from flight_gateway.app import GatewayConfig, HarnessFlightServer
from flight_gateway.catalog import Catalog
from flight_gateway.local.trino import Trino, trino_server

SCAN = "SELECT sum(l_quantity), sum(l_extendedprice), count(*) FROM lineitem"


def _iceberg_tables(root: Path, oracle: Any) -> dict[str, tuple[dict[str, Any], int, str]]:
    """Every TPC-H table as an Iceberg table (pyiceberg, SQLite catalog): per table, the
    harness source config, its snapshot id and its table location."""
    from pyiceberg.catalog.sql import SqlCatalog

    (root / "ice").mkdir()
    props = {"uri": f"sqlite:///{root / 'ice.db'}", "warehouse": f"file://{root / 'ice'}"}
    ice = SqlCatalog("default", **props)  # the name the harness opens it by
    ice.create_namespace("tpch")
    out = {}
    for name in tpch.TABLES:
        data = oracle.execute(f"SELECT * FROM {name}").to_arrow_table()
        table = ice.create_table(f"tpch.{name}", schema=data.schema)
        table.append(data)
        config = {"catalog": {"type": "sql", **props}, "identifier": f"tpch.{name}"}
        out[name] = (config, table.current_snapshot().snapshot_id, table.metadata_location)
    return out


def _plain_catalog(trino: Trino, root: Path, tables: dict[str, Any]) -> str:
    """A Trino Iceberg catalog on a file metastore, with the Iceberg tables registered."""
    (root / "metastore").mkdir()
    props = {
        # Trino's file metastore (its Iceberg connector names it for testing; it is the plain
        # catalog that needs no service).
        "iceberg.catalog.type": "testing_file_metastore",
        "hive.metastore.catalog.dir": f"local://{root / 'metastore'}",
        "iceberg.register-table-procedure.enabled": "true",
        "fs.native-local.enabled": "true",
        "local.location": "/",
    }
    with_ = ", ".join(f"\"{k}\" = '{v}'" for k, v in props.items())
    trino.execute(f"CREATE CATALOG plain USING iceberg WITH ({with_})")
    trino.execute(f"CREATE SCHEMA plain.tpch WITH (location = 'local://{root / 'metastore'}/tpch')")
    for name, (_, _, metadata) in tables.items():
        trino.execute(
            f"CALL plain.system.register_table(schema_name => 'tpch', table_name => '{name}', "
            f"table_location => '{metadata.rsplit('/metadata/', 1)[0]}', "
            f"metadata_file_name => '{metadata.rsplit('/', 1)[1]}')"
        )
    return "plain"


def _run_all(
    trino: Trino, catalog: str, schema: str, statements: list[tuple[int, str]]
) -> tuple[float, dict[int, list]]:
    conn: Any = trino.connect(catalog, schema)
    try:
        cur = conn.cursor()
        answers, started = {}, time.perf_counter()
        for n, sql in statements:
            cur.execute(sql)
            answers[n] = sorted((tuple(r) for r in cur.fetchall()), key=repr)
        return time.perf_counter() - started, answers
    finally:
        conn.close()


def _best_scan(trino: Trino, catalog: str, schema: str, repeats: int = 3) -> float:
    conn: Any = trino.connect(catalog, schema)
    try:
        cur, best = conn.cursor(), float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            cur.execute(SCAN)
            cur.fetchall()
            best = min(best, time.perf_counter() - started)
        return best
    finally:
        conn.close()


def run(quick: bool = False) -> Iterator[dict[str, Any]]:
    sf = 0.1 if quick else 1.0
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        oracle = tpch.generate(sf)
        stack.callback(oracle.close)
        tables = _iceberg_tables(root, oracle)
        catalog = Catalog(f"sqlite:///{root / 'c.db'}")
        stack.callback(catalog.close)
        config = GatewayConfig(port=0, allow_anonymous=True, ticket_key="bench-ticket-key-0123",
                               reach={"any": True}, iceberg_rest_port=0,
                               iceberg_rest_dir=str(root / "rest"))  # fmt: skip
        server = HarnessFlightServer(catalog, config)
        threading.Thread(target=server.serve, daemon=True).start()
        stack.callback(server.shutdown)
        client = HarnessClient(f"grpc://127.0.0.1:{server.port}")
        stack.callback(client.close)
        for name, (source, snapshot, _) in tables.items():
            data = oracle.execute(f"SELECT * FROM {name} LIMIT 0").to_arrow_table()
            client.create_table(name, data.schema)
            client.add_source(name, "i", "iceberg", config=source, state={"snapshot_id": snapshot})
        trino = stack.enter_context(trino_server(heap_mb=3072))
        stack.enter_context(
            trino.iceberg_catalog("harness", f"http://127.0.0.1:{server.rest.port}")
        )
        plain = _plain_catalog(trino, root, tables)
        statements = tpch.trino_queries(oracle)
        _run_all(trino, plain, "tpch", statements)  # warm both (JIT, metadata, page cache)
        _run_all(trino, "harness", "harness", statements)
        repeats = 2 if quick else 1  # a pass at SF 1 takes minutes on 2 cores
        t_plain, expected = min(_run_all(trino, plain, "tpch", statements) for _ in range(repeats))
        t_rest, got = min(_run_all(trino, "harness", "harness", statements) for _ in range(repeats))
        assert got == expected, [n for n in got if got[n] != expected[n]]
        scan_plain = _best_scan(trino, plain, "tpch")
        scan_rest = _best_scan(trino, "harness", "harness")
        rows = oracle.execute("SELECT count(*) FROM lineitem").fetchone()[0]
        yield {"case": f"Trino {sf:g} TPC-H, 22 queries over a plain Iceberg catalog (file metastore)", "value": round(t_plain, 2), "unit": "s", "ratio": 1.0, "ratio_vs": "Trino, plain Iceberg catalog"}  # fmt: skip
        yield {"case": f"Trino {sf:g} TPC-H, 22 queries over the harness's Iceberg REST face (goal >= 0.95x)", "value": round(t_rest, 2), "unit": "s", "ratio": round(t_plain / t_rest, 3), "ratio_vs": "Trino, plain Iceberg catalog"}  # fmt: skip
        yield {"case": f"Trino lineitem scan ({rows:,} rows), plain Iceberg catalog", "value": round(rows / scan_plain), "unit": "rows/s", "ratio": 1.0, "ratio_vs": "Trino, plain Iceberg catalog"}  # fmt: skip
        yield {"case": "Trino lineitem scan through the harness's REST face", "value": round(rows / scan_rest), "unit": "rows/s", "ratio": round(scan_plain / scan_rest, 3), "ratio_vs": "Trino, plain Iceberg catalog"}  # fmt: skip
        yield {"case": "Trino start (JDK 25, single node)", "value": round(trino.started_s, 1), "unit": "s"}  # fmt: skip
