"""Flight SQL on the gateway, driven by real clients on loopback: the ADBC Flight SQL driver
(DBAPI, prepared statements, metadata, pandas) and a raw pyarrow Flight client."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
import pandas as pd
import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest

from clients import HarnessClient
from flight_gateway.protocol.flightsql import pack, pb
from tests.gateway.helpers import running_gateway

pytestmark = pytest.mark.integration


def _write(root: Path, name: str, table: pa.Table) -> str:
    pq.write_table(table, root / name)
    return name


@pytest.fixture
def tables(client: HarnessClient, tmp_path: Path) -> HarnessClient:
    """``orders`` (partitioned by region, one source each) and ``regions``."""
    client.create_table(
        "orders",
        [
            {"name": "id", "type": "int64"},
            {"name": "region", "type": "string"},
            {"name": "amount", "type": "float64"},
        ],
        partition_by=["region"],
        primary_key=["id"],
    )
    for region, ids in (("eu", range(0, 6)), ("us", range(6, 10))):
        rows = pa.table(
            {"id": list(ids), "region": [region] * len(ids), "amount": [i * 1.5 for i in ids]}
        )
        client.add_source(
            "orders",
            region,
            "files",
            partition={"region": region},
            config={"root": str(tmp_path)},
            state={"files": [_write(tmp_path, f"{region}.parquet", rows)]},
        )
    client.create_table(
        "regions", [{"name": "region", "type": "string"}, {"name": "label", "type": "string"}]
    )
    labels = pa.table({"region": ["eu", "us"], "label": ["Europe", "Americas"]})
    client.add_source(
        "regions",
        "r",
        "files",
        config={"root": str(tmp_path)},
        state={"files": [_write(tmp_path, "regions.parquet", labels)]},
    )
    return client


@pytest.fixture
def conn(tables: HarnessClient):
    with flightsql.connect(tables.uri, autocommit=True) as c:
        yield c


def test_queries_equal_native_reads(conn, tables: HarnessClient, tmp_path: Path) -> None:
    cur = conn.cursor()
    cur.execute("SELECT count(*) AS n FROM orders")
    assert cur.fetchall() == [(10,)]
    cur.execute("SELECT id, amount FROM orders WHERE amount > 6 AND region = 'eu' ORDER BY id")
    native = tables.read("orders", columns=["id", "amount"], filter="amount > 6 AND region = 'eu'")
    assert cur.fetch_arrow_table().to_pylist() == native.sort_by("id").to_pylist()
    cur.execute(
        "SELECT r.label, count(*) AS n, sum(o.amount) AS total FROM orders o "
        "JOIN regions r ON o.region = r.region GROUP BY r.label ORDER BY r.label"
    )
    assert cur.fetchall() == [("Americas", 4, 45.0), ("Europe", 6, 22.5)]

    # A pinned version: the table as it was before its newest commit.
    before = tables.describe("orders").version
    more = pa.table({"id": [10], "region": ["eu"], "amount": [99.0]})
    files = tables.describe("orders").source("eu").state["files"]
    tables.commit(
        "orders",
        updates=[
            {"source": "eu", "state": {"files": [*files, _write(tmp_path, "eu2.parquet", more)]}}
        ],
    )
    cur.execute(f"SELECT count(*) FROM orders FOR VERSION AS OF {before}")
    assert cur.fetchall() == [(10,)]
    cur.execute("SELECT count(*) FROM orders")
    assert cur.fetchall() == [(11,)]
    assert tables.read("orders", version=before).num_rows == 10
    cur.close()


def test_prepared_statements_with_parameters(conn) -> None:
    cur = conn.cursor()
    cur.execute(
        "SELECT id FROM orders WHERE region = ? AND id >= ? ORDER BY id", parameters=("eu", 3)
    )
    assert cur.fetchall() == [(3,), (4,), (5,)]
    cur.execute(
        "SELECT id FROM orders WHERE region = ? AND id >= ? ORDER BY id", parameters=("us", 8)
    )
    assert cur.fetchall() == [(8,), (9,)]
    frame = pd.read_sql(
        "SELECT region, count(*) AS n FROM orders GROUP BY region ORDER BY region", conn
    )
    assert frame.to_dict("records") == [{"region": "eu", "n": 6}, {"region": "us", "n": 4}]
    cur.close()


def test_metadata_calls(conn) -> None:
    objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
    assert [o["catalog_name"] for o in objects] == ["harness"]
    schemas = objects[0]["catalog_db_schemas"]
    assert [s["db_schema_name"] for s in schemas] == ["main"]
    found = {
        t["table_name"]: [c["column_name"] for c in t["table_columns"]]
        for t in schemas[0]["db_schema_tables"]
    }
    assert found == {"orders": ["id", "region", "amount"], "regions": ["region", "label"]}
    assert conn.adbc_get_table_schema("regions").names == ["region", "label"]
    assert conn.adbc_get_table_types() == ["TABLE"]
    info = conn.adbc_get_info()
    assert info["vendor_name"] == "DataHarness Flight gateway"


def _raw(uri: str) -> fl.FlightClient:
    return fl.connect(uri)


def test_primary_keys_and_pruning_in_the_plan(tables: HarnessClient, caplog) -> None:
    raw = _raw(tables.uri)
    info = raw.get_flight_info(
        fl.FlightDescriptor.for_command(pack(pb.CommandGetPrimaryKeys(table="orders")))
    )
    keys = raw.do_get(info.endpoints[0].ticket).read_all().to_pylist()
    assert [(k["column_name"], k["key_sequence"]) for k in keys] == [("id", 1)]
    caplog.set_level(logging.INFO, logger="flight_gateway.faces.flightsql.service")
    command = pb.CommandStatementQuery(query="SELECT sum(amount) FROM orders WHERE region = 'us'")
    info = raw.get_flight_info(fl.FlightDescriptor.for_command(pack(command)))
    assert raw.do_get(info.endpoints[0].ticket).read_all().column(0).to_pylist() == [45.0]
    plan = json.loads(
        next(r.message for r in caplog.records if r.message.startswith("flight sql:"))[12:]
    )
    report = plan["orders"]
    assert report["columns"] == ["region", "amount"] and report["filter"] == "(region = 'us')"
    assert {s["name"]: s["pruned"] for s in report["sources"]} == {"eu": True, "us": False}


def test_one_statement_reads_every_table_at_one_moment(
    tables: HarnessClient, tmp_path: Path
) -> None:
    """A writer adds a row to ``a`` then to ``b``, again and again: at any real moment ``a`` has
    the same number of rows as ``b`` or one more. A statement planned at one moment and run later
    must see exactly that moment."""
    for name in ("a", "b"):
        tables.create_table(name, [{"name": "id", "type": "int64"}])
        tables.add_source(name, "s", "files", config={"root": str(tmp_path)}, state={"files": []})
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            for name in ("a", "b"):
                f = _write(tmp_path, f"{name}-{i}.parquet", pa.table({"id": [i]}))
                files = tables.describe(name).source("s").state["files"]
                tables.commit(name, updates=[{"source": "s", "state": {"files": [*files, f]}}])
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    raw = _raw(tables.uri)
    query = "SELECT (SELECT count(*) FROM a) AS na, (SELECT count(*) FROM b) AS nb"
    seen = set()
    try:
        for _ in range(15):
            info = raw.get_flight_info(
                fl.FlightDescriptor.for_command(pack(pb.CommandStatementQuery(query=query)))
            )
            pins = json.loads(info.app_metadata)["pins"]
            threading.Event().wait(0.05)  # the writer commits on meanwhile
            row = raw.do_get(info.endpoints[0].ticket).read_all().to_pylist()[0]
            assert row["na"] - row["nb"] in (0, 1), row
            assert row["na"] == tables.read("a", version=pins[0]).num_rows
            seen.add(row["na"])
    finally:
        stop.set()
        thread.join(30)
    assert len(seen) > 1  # the writer really was committing while statements ran


@pytest.mark.parametrize(
    ("sql", "error", "message"),
    [
        ("SELEC 1", pa.ArrowInvalid, "cannot parse"),  # INVALID_ARGUMENT
        ("SELECT * FROM nope", pa.ArrowKeyError, "does not exist"),  # NOT_FOUND
        ("INSERT INTO orders VALUES (1, 'eu', 1.0)", pa.ArrowInvalid, "INSERT is refused"),
        ("DROP TABLE orders", pa.ArrowInvalid, "is refused"),
        ("SELECT * FROM read_csv('/etc/passwd')", pa.ArrowInvalid, "table functions"),
        ("SELECT * FROM orders, read_csv('/etc/passwd')", pa.ArrowInvalid, "table functions"),
        ("SELECT 1; SELECT 2", pa.ArrowInvalid, "exactly one SQL statement"),
        ("SELECT nosuch FROM orders", pa.ArrowInvalid, "query failed"),
    ],
)
def test_bad_statements(tables: HarnessClient, sql: str, error: type, message: str) -> None:
    raw = _raw(tables.uri)
    with pytest.raises(error, match=message) as caught:
        info = raw.get_flight_info(
            fl.FlightDescriptor.for_command(pack(pb.CommandStatementQuery(query=sql)))
        )
        raw.do_get(info.endpoints[0].ticket).read_all()
    assert not isinstance(caught.value, fl.FlightInternalError)
    assert tables.read("orders").num_rows == 10  # the server still serves


def test_tables_the_caller_may_not_read(tmp_path: Path) -> None:
    tokens = {
        "alice-token": {"name": "alice", "admin": ["*"]},
        "bob-token": {"name": "bob", "read": ["open"]},
    }
    with running_gateway(
        f"sqlite:///{tmp_path / 'c.db'}",
        allow_anonymous=False,
        tokens=tokens,
        reach={"paths": [str(tmp_path)]},
    ) as (server, _):
        admin = HarnessClient(f"grpc://127.0.0.1:{server.port}", token="alice-token")
        for name in ("open", "secret"):
            admin.create_table(name, [{"name": "id", "type": "int64"}])
        joined = "SELECT count(*) FROM open JOIN secret USING (id)"
        with flightsql.connect(  # alice's statement parsed and prepared: cached (plans)
            f"grpc://127.0.0.1:{server.port}",
            db_kwargs={"adbc.flight.sql.authorization_header": "Bearer alice-token"},
            autocommit=True,
        ) as c:
            cur = c.cursor()
            cur.execute(joined)
            assert cur.fetchall() == [(0,)]
        with flightsql.connect(
            f"grpc://127.0.0.1:{server.port}",
            db_kwargs={"adbc.flight.sql.authorization_header": "Bearer bob-token"},
            autocommit=True,
        ) as c:
            cur = c.cursor()
            cur.execute("SELECT count(*) FROM open")
            assert cur.fetchall() == [(0,)]
            with pytest.raises(Exception, match="may not read table 'secret'"):
                cur.execute(joined)  # the same text: cached, and still checked
            tables = c.adbc_get_objects(depth="tables").read_all().to_pylist()
            names = [
                t["table_name"] for t in tables[0]["catalog_db_schemas"][0]["db_schema_tables"]
            ]
            assert names == ["open"]
        admin.close()


def test_writes_are_refused_and_other_commands_unimplemented(tables: HarnessClient) -> None:
    raw = _raw(tables.uri)
    update = pack(pb.CommandStatementUpdate(query="DELETE FROM orders"))
    with pytest.raises(pa.ArrowInvalid, match="read-only"):
        writer, _ = raw.do_put(fl.FlightDescriptor.for_command(update), pa.schema([]))
        writer.close()
    keys = pack(pb.CommandGetExportedKeys(table="orders"))
    with pytest.raises(NotImplementedError):  # UNIMPLEMENTED
        raw.get_flight_info(fl.FlightDescriptor.for_command(keys))


@pytest.mark.parametrize(
    "query", ["SELECT 1", "", "SELECT 'é' || x FROM t", "x" * 300, "y" * 70000]
)
def test_the_clients_statement_bytes_are_protobufs(query: str) -> None:
    """The thin client builds CommandStatementQuery without protobuf: byte for byte what
    protobuf serializes, and what the server unpacks."""
    from flight_gateway.protocol.flightsql import unpack
    from flight_gateway.protocol.flightsql_command import statement

    assert statement(query) == pack(pb.CommandStatementQuery(query=query))
    assert unpack(statement(query)).query == query
