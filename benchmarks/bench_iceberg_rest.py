"""The Iceberg REST face over pinned versions as files (DESIGN §16-§17), in one run:

- cold: lineitem split across a files source, an Iceberg table and a Delta table. The first
  load of a version (nothing cached) and DuckDB's iceberg extension reading through the catalog,
  against DuckDB on the very same Parquet files; the load must write no data file;
- hot tail: the same plus a versioned PostgreSQL table holding 1 % more rows. The first load
  (which makes the tail's slice) against reading that tail by ADBC;
- Kafka: a version that adds 1,000 messages to a sliced range: what its load writes.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.services import postgres_database
from benchmarks.tpch_tables import generate
from clients import HarnessClient
from flight_gateway.app import GatewayConfig, HarnessFlightServer
from flight_gateway.catalog import Catalog
from flight_gateway.local.kafka import local_broker

QUERY = "SELECT l_returnflag, sum(l_quantity), sum(l_extendedprice), count(*) FROM {t} GROUP BY 1"
PARTS = 8  # 0-3 files, 4-5 Iceberg, 6-7 Delta


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


def _load_s(uri: str, table: str) -> float:
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(
            f"{uri}/v1/namespaces/harness/tables/{table}", timeout=600
        ) as r:
            r.read()
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"loading {table}: {e.code} {e.read()[:500]!r}") from None
    return time.perf_counter() - started


def _slices(rest_dir: Path) -> dict[str, int]:
    """Every data file the slice store holds, with its rows."""
    return {str(p): pq.read_metadata(p).num_rows for p in rest_dir.glob("*/slices/*.parquet")}


class _Lake:
    """lineitem's parts as the cold sources: Parquet files, an Iceberg table, a Delta table."""

    def __init__(self, root: Path, lineitem: pa.Table) -> None:
        from deltalake import DeltaTable, write_deltalake
        from pyiceberg.catalog.sql import SqlCatalog

        step = -(-lineitem.num_rows // PARTS)
        parts = [lineitem.slice(i * step, step) for i in range(PARTS)]
        (root / "f").mkdir()
        self.names = [f"part-{i}.parquet" for i in range(4)]
        for name, part in zip(self.names, parts[:4], strict=True):
            pq.write_table(part, root / "f" / name)
        (root / "ice").mkdir()
        props = {"uri": f"sqlite:///{root / 'ice.db'}", "warehouse": f"file://{root / 'ice'}"}
        ice = SqlCatalog("default", **props)  # the name the harness opens it by
        ice.create_namespace("db")
        it = ice.create_table("db.lineitem", schema=lineitem.schema)
        for part in parts[4:6]:
            it.append(part)
        self.iceberg = {"catalog": {"type": "sql", **props}, "identifier": "db.lineitem"}
        self.snapshot = it.current_snapshot().snapshot_id
        self.delta = str(root / "delta")
        for part in parts[6:]:
            write_deltalake(self.delta, part, mode="append")
        dt = DeltaTable(self.delta)
        self.delta_version = dt.version()
        ice_files = [t.file.file_path.removeprefix("file://") for t in it.scan().plan_files()]
        delta_files = [u.removeprefix("file://") for u in dt.file_uris()]
        self.files = [str(root / "f" / n) for n in self.names] + ice_files + delta_files
        self.root, self.schema = root, lineitem.schema

    def table(self, client: HarnessClient, name: str) -> None:
        client.create_table(name, [{"name": f.name, "type": str(f.type)} for f in self.schema])
        client.add_source(name, "f", "files", config={"root": str(self.root / "f")},
                          state={"files": self.names})  # fmt: skip
        client.add_source(name, "i", "iceberg", config=self.iceberg,
                          state={"snapshot_id": self.snapshot})  # fmt: skip
        client.add_source(name, "d", "delta", config={"uri": self.delta},
                          state={"version": self.delta_version})  # fmt: skip


def _cold(client: HarnessClient, lake: _Lake, uri: str, rest_dir: Path, n: int) -> Iterator[dict]:
    lake.table(client, "lineitem")
    load_s = _load_s(uri, "lineitem")
    written = len(_slices(rest_dir))
    con = _duck()
    con.execute(f"ATTACH 'harness' AS h (TYPE iceberg, ENDPOINT '{uri}', AUTHORIZATION_TYPE 'none')")  # fmt: skip
    files = ", ".join(f"'{f}'" for f in lake.files)
    direct = QUERY.format(t=f"read_parquet([{files}], union_by_name = true)")
    via = QUERY.format(t="h.harness.lineitem")
    assert sorted(con.execute(via).fetchall()) == sorted(con.execute(direct).fetchall())
    t_direct = _best(lambda: con.execute(direct).fetchall())
    t_rest = _best(lambda: con.execute(via).fetchall())
    con.close()
    yield {"case": f"cold lineitem ({n:,} rows: files + Iceberg + Delta), DuckDB on the same Parquet files", "value": round(n / t_direct), "unit": "rows/s", "ratio": 1.0, "ratio_vs": "DuckDB on the files"}  # fmt: skip
    yield {"case": "cold lineitem, DuckDB through the gateway's Iceberg REST catalog", "value": round(n / t_rest), "unit": "rows/s", "ratio": round(t_direct / t_rest, 3), "ratio_vs": "DuckDB on the files"}  # fmt: skip
    yield {"case": "cold lineitem, first load of the version (goal <= 0.3 s)", "value": round(load_s, 3), "unit": "s"}  # fmt: skip
    yield {"case": "cold lineitem, data files the first load wrote (goal 0)", "value": written, "unit": "files"}  # fmt: skip


def _pg_tail(dsn: str, tail: pa.Table) -> tuple[str, float]:
    """``tail`` as a versioned PostgreSQL table; (table, its as-of instant)."""
    import adbc_driver_postgresql.dbapi as adbc
    import psycopg

    from planners.postgres.versioning import enable_versioning, server_now

    with adbc.connect(dsn) as conn, conn.cursor() as cur:
        cur.adbc_ingest("tail", tail, mode="create")
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE tail ADD PRIMARY KEY (l_orderkey, l_linenumber)")
        enable_versioning(conn, "tail")
        conn.execute("VACUUM ANALYZE tail")
        return "tail", server_now(conn)


def _hot(
    client: HarnessClient, lake: _Lake, uri: str, dsn: str, tail: pa.Table, rest_dir: Path
) -> Iterator[dict]:
    import adbc_driver_postgresql.dbapi as adbc

    from planners.predicates.sql import postgres_literal

    table, as_of = _pg_tail(dsn, tail)
    lake.table(client, "hot")
    client.add_source("hot", "p", "postgres", config={"dsn": dsn, "table": table},
                      state={"as_of": as_of})  # fmt: skip
    cols = ", ".join(f'"{c}"' for c in tail.column_names)
    at = postgres_literal(as_of)
    sql = (f"SELECT {cols} FROM {table} WHERE sys_period @> {at}::timestamptz UNION ALL "
           f"SELECT {cols} FROM {table}_history WHERE sys_period @> {at}::timestamptz")  # fmt: skip

    def via_adbc() -> None:
        with adbc.connect(dsn) as conn, conn.cursor() as cur:
            cur.execute(sql)
            assert cur.fetch_arrow_table().num_rows == tail.num_rows

    t_adbc = _best(via_adbc)
    before = _slices(rest_dir)
    load_s = _load_s(uri, "hot")
    made = {p: n for p, n in _slices(rest_dir).items() if p not in before}
    again_s = _load_s(uri, "hot")
    con = _duck()
    con.execute(f"ATTACH 'harness' AS h (TYPE iceberg, ENDPOINT '{uri}', AUTHORIZATION_TYPE 'none')")  # fmt: skip
    con.register("tail_rows", tail)
    files = ", ".join(f"'{f}'" for f in lake.files)
    direct = QUERY.format(t=f"(SELECT * FROM read_parquet([{files}]) UNION ALL SELECT * FROM tail_rows)")  # fmt: skip
    assert sorted(con.execute(QUERY.format(t="h.harness.hot")).fetchall()) == sorted(
        con.execute(direct).fetchall()
    )
    con.close()
    n = tail.num_rows
    yield {"case": f"hot tail ({n:,} rows, versioned PostgreSQL), ADBC read of the tail", "value": round(t_adbc, 3), "unit": "s", "ratio": 1.0, "ratio_vs": "ADBC"}  # fmt: skip
    yield {"case": "hot tail, first load of the version (goal <= 2x ADBC)", "value": round(load_s, 3), "unit": "s", "ratio": round(load_s / t_adbc, 3), "ratio_vs": "ADBC (time, lower is better)"}  # fmt: skip
    yield {"case": "hot tail, the same version loaded again", "value": round(again_s, 3), "unit": "s"}  # fmt: skip
    yield {"case": "hot tail, rows the first load wrote (the tail only)", "value": sum(made.values()), "unit": "rows"}  # fmt: skip


def _produce(bootstrap: str, topic: str, ids: range) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in ids:
        producer.produce(topic, value=json.dumps({"id": i, "name": f"n-{i}"}).encode(), partition=0)
        if i % 50_000 == 0:
            producer.poll(0)
    producer.flush(60)


def _kafka(
    client: HarnessClient, uri: str, bootstrap: str, rest_dir: Path, n: int
) -> Iterator[dict]:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"bench-rest-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1)]
    ).values():
        f.result(30)
    _produce(bootstrap, topic, range(n))
    client.create_table("k", [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}])
    cfg = {"bootstrap_servers": bootstrap, "topic": topic, "partition": 0}
    client.add_source("k", "k0", "kafka", config=cfg, state={"low": 0, "high": n})
    first_s = _load_s(uri, "k")
    before = _slices(rest_dir)
    _produce(bootstrap, topic, range(n, n + 1000))
    client.commit("k", updates=[{"source": "k0", "state": {"low": 0, "high": n + 1000}}])
    next_s = _load_s(uri, "k")
    made = {p: rows for p, rows in _slices(rest_dir).items() if p not in before}
    yield {"case": f"Kafka range of {n:,} messages, first load (slices it)", "value": round(first_s, 3), "unit": "s"}  # fmt: skip
    yield {"case": "Kafka, next version adds 1,000 messages: its load", "value": round(next_s, 3), "unit": "s", "ratio": round(first_s / next_s, 3), "ratio_vs": "first load"}  # fmt: skip
    yield {"case": "Kafka, rows that load wrote (goal 1,000)", "value": sum(made.values()), "unit": "rows"}  # fmt: skip


def run(quick: bool = False) -> Iterator[dict[str, Any]]:
    sf = 0.1 if quick else 1.0
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        lineitem = generate(sf).execute("SELECT * FROM lineitem").to_arrow_table()
        lake = _Lake(root, lineitem)
        catalog = Catalog(f"sqlite:///{root / 'c.db'}")
        stack.callback(catalog.close)
        rest_dir = root / "rest"
        config = GatewayConfig(port=0, allow_anonymous=True, ticket_key="bench-ticket-key-0123",
                               reach={"any": True}, iceberg_rest_port=0,
                               iceberg_rest_dir=str(rest_dir))  # fmt: skip
        server = HarnessFlightServer(catalog, config)
        threading.Thread(target=server.serve, daemon=True).start()
        stack.callback(server.shutdown)
        client = HarnessClient(f"grpc://127.0.0.1:{server.port}")
        stack.callback(client.close)
        uri = f"http://127.0.0.1:{server.rest.port}"
        yield from _cold(client, lake, uri, rest_dir, lineitem.num_rows)
        dsn = stack.enter_context(postgres_database())
        if dsn:
            tail = lineitem.slice(0, lineitem.num_rows // 100)
            yield from _hot(client, lake, uri, dsn, tail, rest_dir)
        bootstrap = stack.enter_context(local_broker())
        yield from _kafka(client, uri, bootstrap, rest_dir, 20_000 if quick else 200_000)
