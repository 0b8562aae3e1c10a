"""Read path over real Parquet files, a real pyiceberg catalog and a real DuckLake."""

from __future__ import annotations

import datetime
import json
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from clients import HarnessClient
from tests.gateway.helpers import DuckLakeFixture, IcebergFixture, write_parquet

SCHEMA = [
    {"name": "id", "type": "int64"},
    {"name": "level", "type": "string"},
    {"name": "value", "type": "double"},
]


ARROW_SCHEMA = pa.schema([("id", pa.int64()), ("level", pa.string()), ("value", pa.float64())])


def rows(start: int, n: int, level: str) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table(
        {"id": ids, "level": [level] * n, "value": [i * 0.5 for i in ids]}, schema=ARROW_SCHEMA
    )


def ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


@pytest.fixture
def three_tier(
    client: HarnessClient, tmp_path: Path, iceberg: IcebergFixture, ducklake: DuckLakeFixture
) -> dict:
    """A table over Parquet files (ERROR), an Iceberg table (INFO) and a DuckLake table (DEBUG)."""
    client.create_table("logs", SCHEMA, partition_by=["level"])
    f1 = write_parquet(tmp_path / "files" / "a.parquet", rows(0, 100, "ERROR"))
    ice = iceberg.create("events", ARROW_SCHEMA)
    ice.append(rows(1000, 50, "INFO"))
    lake_snap = ducklake.execute(
        "CREATE TABLE lake.t (id BIGINT, level VARCHAR, value DOUBLE)",
        "INSERT INTO lake.t SELECT i, 'DEBUG', i * 0.5 FROM range(2000, 2030) r(i)",
    )
    client.commit(
        "logs",
        add_sources=[
            {
                "name": "files",
                "kind": "files",
                "partition": {"level": "ERROR"},
                "config": {"format": "parquet", "root": str(tmp_path / "files")},
                "state": {"files": ["a.parquet"]},
            },
            {
                "name": "ice",
                "kind": "iceberg",
                "partition": {"level": "INFO"},
                "config": iceberg.source_config("events"),
                "state": {"snapshot_id": ice.current_snapshot().snapshot_id},
            },
            {
                "name": "lake",
                "kind": "ducklake",
                "partition": {"level": "DEBUG"},
                "config": ducklake.source_config("t"),
                "state": {"snapshot_id": lake_snap},
            },
        ],
    )
    return {"files": f1, "ice": ice, "tmp": tmp_path}


def test_union_of_three_kinds(client: HarnessClient, three_tier: dict) -> None:
    t = client.read("logs")
    assert t.schema.names == ["id", "level", "value"]
    assert ids(t) == list(range(100)) + list(range(1000, 1050)) + list(range(2000, 2030))
    assert t.schema.field("id").type == pa.int64()


def test_projection_and_filter(client: HarnessClient, three_tier: dict) -> None:
    t = client.read("logs", columns=["value"], filter="id >= 95 AND id < 2002 AND value > 1")
    assert t.schema.names == ["value"]
    expected = [i * 0.5 for i in [*range(95, 100), *range(1000, 1050), 2000, 2001]]
    assert sorted(t.column("value").to_pylist()) == expected


def test_pruned_sources_are_not_opened(
    client: HarnessClient, three_tier: dict, tmp_path: Path
) -> None:
    # Break the Iceberg and DuckLake sources: if they were opened, the read would fail.
    client.commit(
        "logs",
        updates=[
            {"source": "ice", "state": {"snapshot_id": 123456789}},
            {"source": "lake", "state": {"snapshot_id": 987654}},
        ],
    )
    info = client.flight_info("logs", filter="level = 'ERROR' AND id < 10")
    meta = json.loads(info.app_metadata)
    assert {s["name"]: s["pruned"] for s in meta["sources"]} == {
        "files": False,
        "ice": True,
        "lake": True,
    }
    assert len(info.endpoints) == 1
    assert ids(client.read("logs", filter="level = 'ERROR' AND id < 10")) == list(range(10))
    assert ids(client.read("logs", filter="level IN ('ERROR', 'WARN')")) == list(range(100))


def test_time_travel_by_version_and_timestamp(client: HarnessClient, three_tier: dict) -> None:
    tmp = three_tier["tmp"]
    v1 = client.describe("logs").version
    t1 = client.describe("logs").committed_at
    time.sleep(0.05)
    write_parquet(tmp / "files" / "b.parquet", rows(100, 20, "ERROR"))
    ice = three_tier["ice"]
    ice.append(rows(1050, 5, "INFO"))
    v2 = client.commit(
        "logs",
        updates=[
            {"source": "files", "state": {"files": ["a.parquet", "b.parquet"]}},
            {"source": "ice", "state": {"snapshot_id": ice.current_snapshot().snapshot_id}},
        ],
    )
    assert len(client.read("logs", version=v1)) == 180
    assert len(client.read("logs", version=v2)) == 205
    assert len(client.read("logs")) == 205
    assert len(client.read("logs", as_of=t1)) == 180
    as_iso = datetime.datetime.fromtimestamp(t1, datetime.UTC).isoformat()
    assert len(client.read("logs", as_of=as_iso)) == 180


@pytest.mark.slow
def test_pinned_reads_stay_identical_while_writers_commit(
    client: HarnessClient, three_tier: dict
) -> None:
    tmp, ice = three_tier["tmp"], three_tier["ice"]
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            i = 0
            files = ["a.parquet"]
            while not stop.is_set():
                i += 1
                name = f"w{i}.parquet"
                write_parquet(tmp / "files" / name, rows(10_000 + i * 10, 10, "ERROR"))
                files.append(name)
                ice.append(rows(20_000 + i * 10, 10, "INFO"))
                client.commit(
                    "logs",
                    updates=[
                        {"source": "files", "state": {"files": list(files)}},
                        {
                            "source": "ice",
                            "state": {"snapshot_id": ice.current_snapshot().snapshot_id},
                        },
                    ],
                )
        except BaseException as e:  # surfaced below
            errors.append(e)

    pinned = client.describe("logs").version
    baseline = client.read("logs", version=pinned).sort_by("id")
    th = threading.Thread(target=writer)
    th.start()
    try:
        # At least 4 s and 4 pairs of reads (a loaded machine is slow, never wrong).
        start, reads = time.monotonic(), 0
        while (time.monotonic() - start < 4 or reads < 4) and time.monotonic() - start < 120:
            assert client.read("logs", version=pinned).sort_by("id").equals(baseline)
            latest = client.read("logs")
            # Every latest read is some whole version: a multiple of 20 new rows, no duplicates.
            assert len(set(latest.column("id").to_pylist())) == latest.num_rows
            assert (latest.num_rows - baseline.num_rows) % 20 == 0
            reads += 1
    finally:
        stop.set()
        th.join()
    assert not errors, errors
    assert reads > 3 and client.describe("logs").version > pinned


def test_schema_evolution_reads(client: HarnessClient, three_tier: dict) -> None:
    old = client.describe("logs").version
    client.evolve_schema(
        "logs",
        [
            {"op": "rename_column", "name": "value", "new_name": "amount"},
            {"op": "add_column", "name": "host", "type": "string"},
        ],
    )
    new = client.read("logs", filter="level = 'ERROR' AND id < 3")
    assert new.schema.names == ["id", "level", "amount", "host"]
    # Renamed column found under its old physical name; the new column is null.
    assert new.sort_by("id").column("amount").to_pylist() == [0.0, 0.5, 1.0]
    assert new.column("host").null_count == 3
    assert client.read("logs", version=old).schema.names == ["id", "level", "value"]
    # A column no source has physically still yields one (null) row per row of every kind.
    only_new = client.read("logs", columns=["host"])
    assert only_new.num_rows == 180 and only_new.column("host").null_count == 180


def test_limit(client: HarnessClient, three_tier: dict) -> None:
    assert client.read("logs", limit=7).num_rows == 7
    assert client.read("logs", filter="level = 'DEBUG'", limit=3).num_rows == 3


def test_flight_source_proxies_upstream(client: HarnessClient, tmp_path: Path) -> None:
    import pyarrow.flight as fl

    data = rows(0, 1000, "X")

    class Upstream(fl.FlightServerBase):
        def get_flight_info(self, context, descriptor):
            return fl.FlightInfo(
                data.schema,
                descriptor,
                [fl.FlightEndpoint(b"a", []), fl.FlightEndpoint(b"b", [])],
                -1,
                -1,
            )

        def do_get(self, context, ticket):
            half = data.slice(0, 500) if ticket.ticket == b"a" else data.slice(500)
            return fl.RecordBatchStream(half)

    with Upstream("grpc://127.0.0.1:0") as up:
        client.create_table("proxied", SCHEMA)
        client.add_source(
            "proxied",
            "up",
            "flight",
            config={"location": f"grpc://127.0.0.1:{up.port}", "descriptor": {"path": ["x"]}},
        )
        info = client.flight_info("proxied")
        assert len(info.endpoints) == 2
        assert ids(client.read("proxied")) == list(range(1000))
        assert ids(client.read("proxied", filter="id BETWEEN 10 AND 12")) == [10, 11, 12]


@pytest.mark.parametrize("adapter", ["arrow", "pandas", "polars", "duckdb"])
def test_dataframe_adapters_agree(client: HarnessClient, three_tier: dict, adapter: str) -> None:
    kwargs = {"columns": ["id", "value"], "filter": "id < 1010"}
    if adapter == "arrow":
        out = client.read("logs", **kwargs).to_pylist()
    elif adapter == "pandas":
        out = client.to_pandas("logs", **kwargs).to_dict("records")
    elif adapter == "polars":
        out = client.to_polars("logs", **kwargs).to_dicts()
    else:
        out = client.to_duckdb("logs", **kwargs).arrow().read_all().to_pylist()
    assert sorted((r["id"], r["value"]) for r in out) == [
        (i, i * 0.5) for i in [*range(100), *range(1000, 1010)]
    ]


def test_iceberg_delete_respects_pins(client: HarnessClient, three_tier: dict) -> None:
    ice = three_tier["ice"]
    before = client.describe("logs").version
    ice.delete("id < 1010")
    after = client.commit(
        "logs",
        updates=[{"source": "ice", "state": {"snapshot_id": ice.current_snapshot().snapshot_id}}],
    )
    assert ids(client.read("logs", version=before, filter="level = 'INFO'")) == list(
        range(1000, 1050)
    )
    assert ids(client.read("logs", version=after, filter="level = 'INFO'")) == list(
        range(1010, 1050)
    )
