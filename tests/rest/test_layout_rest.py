"""Pinned versions as files through the Iceberg REST face (DESIGN §16-§17), read by independent
clients (pyiceberg's RestCatalog without a token, DuckDB's iceberg extension in a fresh
connection: its first query on a brand-new version) and compared with the harness's own read
at the same versions:

- cold sources (Parquet files, Iceberg with position and equality deletes, Delta) are served
  where they are: the load writes no data file;
- hot sources (Kafka, versioned PostgreSQL) are sliced once per state, and a version that adds
  1,000 Kafka messages writes one piece with just those;
- a dropped and re-created table and an expired version are never served; an expired version's
  slices are swept, but not while a reader holds them.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from planners.iceberg_deletes import write_changes, write_position_deletes
from tests.gateway.helpers import (
    DuckLakeFixture,
    IcebergFixture,
    client_for,
    running_gateway,
    write_parquet,
)
from tests.gateway.kafka_helpers import new_topic, produce
from tests.rest.helpers import duckdb_rows, get, pyiceberg_catalog, rows, versioned_pg_table

pytestmark = pytest.mark.integration
ARROW = pa.schema([("id", pa.int64()), ("region", pa.string())])
COLS = ["id", "region"]


def _gateway(tmp_path: Path, **rest: Any) -> Any:
    return running_gateway(
        f"sqlite:///{tmp_path / 'c.db'}",
        reach={"any": True},
        iceberg_rest_port=0,
        iceberg_rest_dir=str(tmp_path / "rest"),
        iceberg_rest=rest,
    )


def _slices(rest_dir: Path) -> list[Path]:
    return sorted(rest_dir.glob("t*/slices/*.parquet"))


def _independent_reads(uri: str, client: Any, version: int) -> None:
    """pyiceberg (no token) and DuckDB (fresh connection) read ``version`` as the harness does."""
    expected = rows(client.read("t", version=version), COLS)
    status, body = get(f"{uri}/v1/namespaces/harness/tables/t?version={version}")
    assert status == 200, body
    snap = body["metadata"]["current-snapshot-id"]
    table = pyiceberg_catalog(uri).load_table("harness.t")
    assert rows(table.scan(snapshot_id=snap).to_arrow(), COLS) == expected
    assert duckdb_rows(uri, "t", COLS, snapshot=snap) == expected


def test_cold_sources_are_read_where_they_are(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    # Parquet files (one with a narrower id type, read as the harness's int64)
    write_parquet(tmp_path / "f" / "a.parquet", pa.table({"id": [1, 2], "region": ["f", "f"]}))
    narrow = pa.table({"id": pa.array([3], pa.int32()), "region": ["f"]})
    write_parquet(tmp_path / "f" / "b.parquet", narrow)
    # Iceberg with a position delete and an equality delete
    ice = IcebergFixture(tmp_path / "ice")
    it = ice.create("r", ARROW)
    it.append(pa.table({"id": [10, 11, 12, 13], "region": ["i"] * 4}, schema=ARROW))
    path = next(iter(it.scan().plan_files())).file.file_path
    write_position_deletes(it, {path: [0]})  # id 10
    it.refresh()
    write_changes(it, data=pa.table({"id": [14], "region": ["i"]}, schema=ARROW),
                  deletes=pa.table({"id": [12]}), equality_ids=[1])  # fmt: skip
    it.refresh()
    # Delta, unpartitioned
    delta = str(tmp_path / "delta")
    write_deltalake(delta, pa.table({"id": [20, 21], "region": ["d", "d"]}, schema=ARROW))
    with _gateway(tmp_path) as (server, _):
        client = client_for(server)
        client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "region", "type": "string"}])  # fmt: skip
        client.add_source("t", "f", "files", config={"root": str(tmp_path / "f")},
                          state={"files": ["a.parquet", "b.parquet"]})  # fmt: skip
        client.add_source("t", "i", "iceberg", config=ice.source_config("r"),
                          state={"snapshot_id": it.current_snapshot().snapshot_id})  # fmt: skip
        v1 = client.add_source("t", "d", "delta", config={"uri": delta}, state={"version": 0})
        assert sorted(client.read("t").column("id").to_pylist()) == [1, 2, 3, 11, 13, 14, 20, 21]
        uri = f"http://127.0.0.1:{server.rest.port}"
        _independent_reads(uri, client, v1)
        assert _slices(tmp_path / "rest") == []  # nothing copied
        # The Iceberg table moves on; a new harness version pins it; v1 still reads as before.
        it.append(pa.table({"id": [15], "region": ["i"]}, schema=ARROW))
        v2 = client.commit("t", updates=[{"source": "i", "state": {"snapshot_id": it.current_snapshot().snapshot_id}}])  # fmt: skip
        assert duckdb_rows(uri, "t", COLS) == rows(client.read("t", version=v2), COLS)
        _independent_reads(uri, client, v1)
        _independent_reads(uri, client, v2)
        assert _slices(tmp_path / "rest") == []
        client.close()


def test_ducklake_snapshots_are_read_where_they_are_unless_rows_were_inlined(
    tmp_path: Path,
) -> None:
    """A DuckLake snapshot is its data files in place, columns by DuckLake's column ids (the
    files' field ids: a column renamed in both still reads from its older files); once rows
    were inlined in the lake's metadata, its files are not all its rows and it is sliced."""
    lake = DuckLakeFixture(tmp_path / "lake")
    many = "INSERT INTO lake.r SELECT range, 'r' || range FROM range({}, {})"
    first = lake.execute("CREATE TABLE lake.r (id BIGINT, region VARCHAR)", many.format(0, 500))
    with _gateway(tmp_path) as (server, _):
        client = client_for(server)
        client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "region", "type": "string"}])  # fmt: skip
        v1 = client.add_source("t", "l", "ducklake", config=lake.source_config("r"),
                               state={"snapshot_id": first})  # fmt: skip
        uri = f"http://127.0.0.1:{server.rest.port}"
        _independent_reads(uri, client, v1)
        assert _slices(tmp_path / "rest") == []  # nothing copied
        renamed = lake.execute("ALTER TABLE lake.r RENAME COLUMN region TO zone",
                               many.format(500, 1000))  # fmt: skip
        client.evolve_schema("t", [{"op": "rename_column", "name": "region", "new_name": "zone"}])
        client.commit("t", updates=[{"source": "l", "state": {"snapshot_id": renamed}}])
        cols = ["id", "zone"]
        expected = rows(client.read("t"), cols)
        assert expected[0] == (0, "r0") and expected[-1] == (999, "r999")
        assert len(expected) == 1000
        table = pyiceberg_catalog(uri).load_table("harness.t")
        assert rows(table.scan().to_arrow(), cols) == expected
        assert duckdb_rows(uri, "t", cols) == expected
        assert _slices(tmp_path / "rest") == []
        inlined = lake.execute("INSERT INTO lake.r VALUES (1000, 'r1000')")  # a few rows: inlined
        client.commit("t", updates=[{"source": "l", "state": {"snapshot_id": inlined}}])
        expected = rows(client.read("t"), cols)
        assert expected[-1] == (1000, "r1000") and len(expected) == 1001
        assert duckdb_rows(uri, "t", cols) == expected
        assert _slices(tmp_path / "rest") != []
        _independent_reads(uri, client, v1)
        client.close()


def test_renamed_and_added_columns_read_right(tmp_path: Path) -> None:
    """Files without field ids, read by name through the name mapping: a renamed column's old
    files still fill it, an added column is null in files that predate it."""
    write_parquet(tmp_path / "f" / "a.parquet", pa.table({"id": [1, 2], "region": ["a", "b"]}))
    with _gateway(tmp_path) as (server, _):
        client = client_for(server)
        client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "region", "type": "string"}])  # fmt: skip
        v1 = client.add_source("t", "f", "files", config={"root": str(tmp_path / "f")},
                               state={"files": ["a.parquet"]})  # fmt: skip
        client.evolve_schema("t", [
            {"op": "rename_column", "name": "region", "new_name": "zone"},
            {"op": "add_column", "name": "score", "type": "float64"},
        ])  # fmt: skip
        newer = pa.table({"id": [3], "zone": ["c"], "score": [0.5]})
        write_parquet(tmp_path / "f" / "b.parquet", newer)
        v3 = client.commit("t", updates=[{"source": "f", "state": {"files": ["a.parquet", "b.parquet"]}}])  # fmt: skip
        uri = f"http://127.0.0.1:{server.rest.port}"
        cols = ["id", "zone", "score"]
        expected = rows(client.read("t", version=v3), cols)
        assert expected == [(1, "a", None), (2, "b", None), (3, "c", 0.5)]
        assert (
            rows(pyiceberg_catalog(uri).load_table("harness.t").scan().to_arrow(), cols) == expected
        )
        assert duckdb_rows(uri, "t", cols) == expected
        # The first version, by its snapshot id, still has its rows.
        status, body = get(f"{uri}/v1/namespaces/harness/tables/t?version={v1}")
        assert status == 200
        old = body["metadata"]["current-snapshot-id"]
        assert sorted(duckdb_rows(uri, "t", ["id"], snapshot=old)) == [(1,), (2,)]
        assert _slices(tmp_path / "rest") == []
        client.close()


def _pieces(rest_dir: Path) -> list[tuple[str, Any, int]]:
    """(family, state, rows) of every slice piece in the store's index."""
    db = sqlite3.connect(rest_dir / "index.db")
    try:
        out = db.execute(
            "SELECT family, state, files FROM artifacts WHERE family LIKE 'p-%'"
        ).fetchall()
    finally:
        db.close()
    return [(f, json.loads(s), sum(x["rows"] for x in json.loads(fs))) for f, s, fs in out]


def test_hot_sources_are_sliced_once_per_piece(
    tmp_path: Path, pg_dsn: str, kafka_bootstrap: str
) -> None:
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, [json.dumps({"id": i, "region": "k"}).encode() for i in range(50)])  # fmt: skip
    pg, as_of = versioned_pg_table(pg_dsn, "SELECT g, 'p' FROM generate_series(1000, 1099) g")
    with _gateway(tmp_path) as (server, _):
        client = client_for(server)
        client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "region", "type": "string"}])  # fmt: skip
        kafka = {"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0}
        client.add_source("t", "k", "kafka", config=kafka, state={"low": 0, "high": 50})
        v1 = client.add_source("t", "p", "postgres", config={"dsn": pg_dsn, "table": pg},
                               state={"as_of": as_of})  # fmt: skip
        uri = f"http://127.0.0.1:{server.rest.port}"
        _independent_reads(uri, client, v1)
        first = _pieces(tmp_path / "rest")
        assert sorted(r for _, _, r in first) == [50, 100]  # one Kafka piece, one Postgres slice
        # 1,000 more messages: the next version's load writes only those.
        values = [json.dumps({"id": i, "region": "k"}).encode() for i in range(50, 1050)]
        produce(kafka_bootstrap, topic, values)
        v2 = client.commit("t", updates=[{"source": "k", "state": {"low": 0, "high": 1050}}])
        _independent_reads(uri, client, v2)
        second = _pieces(tmp_path / "rest")
        new = [p for p in second if p not in first]
        assert [(state, n) for _, state, n in new] == [({"low": 50, "high": 1050}, 1000)]
        _independent_reads(uri, client, v1)  # still as it was
        client.close()


def test_dropped_recreated_and_expired_versions_are_never_served(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, [json.dumps({"id": i, "region": "k"}).encode() for i in range(10)])  # fmt: skip
    kafka = {"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0}
    schema = [{"name": "id", "type": "int64"}, {"name": "region", "type": "string"}]
    with _gateway(tmp_path, pin_s=0.5) as (server, _):
        client = client_for(server)
        uri = f"http://127.0.0.1:{server.rest.port}"
        url = f"{uri}/v1/namespaces/harness/tables/t"
        client.create_table("t", schema)
        client.add_source("t", "k", "kafka", config=kafka, state={"low": 0, "high": 10})
        status, first = get(url)
        assert status == 200
        old_snapshot = first["metadata"]["current-snapshot-id"]
        # Dropped and created again with other rows: the new table's rows, never the old ones.
        client.drop_table("t")
        client.create_table("t", schema)
        client.add_source("t", "k", "kafka", config=kafka, state={"low": 5, "high": 6})
        assert duckdb_rows(uri, "t", ["id"]) == [(5,)]
        status, body = get(url)
        assert old_snapshot not in [s["snapshot-id"] for s in body["metadata"]["snapshots"]]
        assert status == 200 and body["metadata"]["current-snapshot-id"] != old_snapshot
        # Expired versions: NOT_FOUND, and their slices swept once nothing holds them. Each
        # version adds a Kafka piece; the last drains the first two.
        for low, high in ((5, 7), (5, 8), (7, 9)):
            client.commit("t", updates=[{"source": "k", "state": {"low": low, "high": high}}])
            assert get(url)[0] == 200
        latest = client.describe("t").version
        rest = server.rest.rest
        table_id = server.core.reads.snapshot("t").table_id
        time.sleep(0.6)  # past the loads' pins
        rest.layouts.sweep()  # the dropped table's slices go
        before = _slices(tmp_path / "rest")
        assert len(before) == 4  # [5, 6) [6, 7) [7, 8) [8, 9)
        client.expire_versions("t", keep_last=1)
        status, body = get(f"{url}?version={latest - 1}")
        assert status == 404 and body["error"]["type"] == "NoSuchTableException"
        with rest.store.hold(table_id, latest - 1):  # a reader still holds that version's files
            time.sleep(0.6)  # past the loads' pins
            rest.layouts.sweep()
            assert _slices(tmp_path / "rest") == before
        rest.layouts.sweep()
        assert len(_slices(tmp_path / "rest")) == 2  # the latest version's pieces
        assert duckdb_rows(uri, "t", ["id"]) == [(7,), (8,)]
        client.close()


def test_hudi_base_files_are_read_where_they_are(tmp_path: Path, hudi_spark: Any) -> None:
    """A copy-on-write Hudi table is served as its base files in place; a merge-on-read one
    whose deletes sit in log files is sliced (merged by hudi-rs once). Both read by pyiceberg
    and DuckDB as Spark reads them."""
    from flight_gateway.local.hudi import COW, MOR

    data = pa.table({"id": list(range(10)), "region": ["e", "w"] * 5}, schema=ARROW)
    gone = pa.table({"id": [3, 4], "region": ["w", "e"]}, schema=ARROW)
    tables = {}
    for name, table_type in (("cow", COW), ("mor", MOR)):
        uri = str(tmp_path / name)
        hudi_spark.write(uri, data, table_type=table_type)
        tables[name] = (uri, hudi_spark.write(uri, gone, operation="delete", table_type=table_type))
    with _gateway(tmp_path) as (server, _):
        client = client_for(server)
        rest = f"http://127.0.0.1:{server.rest.port}"
        client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "region", "type": "string"}])  # fmt: skip
        uri, instant = tables["cow"]
        v1 = client.add_source("t", "h", "hudi", config={"uri": uri}, state={"instant": instant})
        want = rows(hudi_spark.read(uri, instant), COLS)
        assert want == rows(client.read("t", version=v1), COLS)
        _independent_reads(rest, client, v1)
        assert _slices(tmp_path / "rest") == []  # nothing copied
        uri, instant = tables["mor"]
        v2 = client.commit("t", remove_sources=["h"], add_sources=[
            {"name": "m", "kind": "hudi", "config": {"uri": uri}, "state": {"instant": instant}}
        ])  # fmt: skip
        assert rows(hudi_spark.read(uri, instant), COLS) == want
        _independent_reads(rest, client, v2)
        assert _slices(tmp_path / "rest") != []  # merged once, served as a slice
        client.close()


def test_file_columns_that_are_no_harness_column_are_skipped(tmp_path: Path) -> None:
    """Files in place holding columns the harness table does not have (Parquet files, Delta):
    pyiceberg refuses a file with a column its name mapping lacks, so the mapping names them."""
    from deltalake import write_deltalake

    wide = pa.table({"id": [1, 2], "region": ["f", "f"], "junk": [9.5, 9.5]})
    write_parquet(tmp_path / "f" / "a.parquet", wide)
    delta = str(tmp_path / "delta")
    write_deltalake(delta, pa.table({"id": [20], "region": ["d"], "extra": ["x"]}))
    with _gateway(tmp_path) as (server, _):
        client = client_for(server)
        client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "region", "type": "string"}])  # fmt: skip
        client.add_source("t", "f", "files", config={"root": str(tmp_path / "f")},
                          state={"files": ["a.parquet"]})  # fmt: skip
        v1 = client.add_source("t", "d", "delta", config={"uri": delta}, state={"version": 0})
        assert rows(client.read("t"), COLS) == [(1, "f"), (2, "f"), (20, "d")]
        _independent_reads(f"http://127.0.0.1:{server.rest.port}", client, v1)
        assert _slices(tmp_path / "rest") == []
        client.close()
