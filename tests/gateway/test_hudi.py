"""Hudi tables written outside the harness by Spark with Hudi's own Spark bundle (inserts,
upserts, deletes; a partitioned copy-on-write table and a merge-on-read one with log files),
read through the gateway at two instants and compared to Spark's own Hudi read of the same
instants (the peer as oracle); partition pruning; SQL and direct reads; what a source refuses."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from clients import HarnessClient
from flight_gateway.local.hudi import COW, MOR
from flight_gateway.protocol.errors import InvalidArgument, NotFound

pytestmark = pytest.mark.integration

SCHEMA = pa.schema(
    [("id", pa.int64()), ("region", pa.string()), ("amount", pa.float64()), ("ts", pa.int64())]
)
COLUMNS = [{"name": f.name, "type": str(f.type)} for f in SCHEMA]


def _rows(ids: list[int], ts: int, scale: float = 0.5) -> pa.Table:
    return pa.table(
        {
            "id": ids,
            "region": ["eu" if i % 3 else "us" for i in ids],
            "amount": [None if i % 11 == 4 else i * scale for i in ids],
            "ts": [ts] * len(ids),
        },
        schema=SCHEMA,
    )


def _sorted(t: pa.Table) -> list[dict[str, Any]]:
    return sorted(t.select(SCHEMA.names).to_pylist(), key=lambda r: r["id"])


def _history(spark: Any, uri: str, table_type: str, partition: str | None) -> list[str]:
    """Three commits: inserts, an upsert (updates and new keys), deletes."""
    kw = {"table_type": table_type, "precombine": "ts", "partition": partition}
    return [
        spark.write(uri, _rows(list(range(0, 60)), 1), operation="insert", **kw),
        spark.write(uri, _rows([*range(0, 60, 4), 60, 61], 2, 9.0), operation="upsert", **kw),
        spark.write(uri, _rows([1, 5, 9, 60], 3), operation="delete", **kw),
    ]


def _pin(client: HarnessClient, uri: str, instants: list[str], **config: Any) -> list[int]:
    client.create_table("h", COLUMNS)
    versions = [
        client.add_source(
            "h", "s", "hudi", config={"uri": uri, **config}, state={"instant": instants[0]}
        )
    ]
    for instant in instants[1:]:
        versions.append(
            client.commit("h", updates=[{"source": "s", "state": {"instant": instant}}])
        )
    return versions


@pytest.mark.parametrize(
    ("table_type", "partition"), [(COW, "region"), (MOR, None), (MOR, "region")]
)
def test_rows_equal_sparks_hudi_read_at_each_instant(
    client: HarnessClient, hudi_spark: Any, tmp_path, table_type: str, partition: str | None
) -> None:
    uri = str(tmp_path / "orders")
    instants = _history(hudi_spark, uri, table_type, partition)
    versions = _pin(client, uri, instants)
    for version, instant in zip(versions, instants, strict=True):
        want = _sorted(hudi_spark.read(uri, instant))
        assert _sorted(client.read("h", version=version)) == want, instant
        flt = "region = 'eu' AND amount > 5"
        expected = [r for r in want if r["region"] == "eu" and (r["amount"] or 0) > 5]
        assert _sorted(client.read("h", version=version, filter=flt)) == expected
    # The latest instant differs from the first: upserted values and deletes are applied.
    first, last = (_sorted(client.read("h", version=v)) for v in (versions[0], versions[-1]))
    assert first != last and len(last) == 60 + 2 - 4
    if table_type == MOR:
        assert _has_log_files(uri, instants[-1]), "the merge-on-read case must read log files"


def _has_log_files(uri: str, instant: str) -> bool:
    from hudi import HudiReadOptions, HudiTable

    slices = HudiTable(uri).get_file_slices(HudiReadOptions().with_as_of_timestamp(instant))
    return any(s.log_file_names for s in slices)


def test_partition_pruning_sql_and_direct_reads(
    client: HarnessClient, hudi_spark: Any, tmp_path
) -> None:
    import adbc_driver_flightsql.dbapi as flightsql

    uri = str(tmp_path / "orders")
    instants = _history(hudi_spark, uri, COW, "region")
    v1, _, v3 = _pin(client, uri, instants, direct=True, target_task_bytes=1)

    def tasks(**read: Any) -> int:
        meta = json.loads(client.flight_info("h", **read).app_metadata)
        return sum(s["tasks"] for s in meta["sources"])

    assert tasks(filter="region = 'us'") < tasks()
    want = _sorted(hudi_spark.read(uri, instants[0]))
    assert _sorted(client.read("h", version=v1, direct=True)) == want
    assert _sorted(client.read("h", direct=True)) == _sorted(hudi_spark.read(uri, instants[2]))
    with flightsql.connect(client.uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id, region, amount, ts FROM h FOR VERSION AS OF {v1}")
        assert _sorted(cur.fetch_arrow_table()) == want
        cur.execute("SELECT count(*), sum(amount) FROM h WHERE region = 'eu'")
        got = cur.fetchone()
    latest = client.read("h", version=v3, filter="region = 'eu'")
    assert got == (latest.num_rows, pa.compute.sum(latest.column("amount")).as_py())


def test_streaming_reads_each_commit_once(client: HarnessClient, hudi_spark: Any, tmp_path) -> None:
    uri = str(tmp_path / "events")
    kw = {"table_type": MOR, "precombine": "ts"}
    instants = [
        hudi_spark.write(uri, _rows(list(ids), 1), operation="insert", **kw)
        for ids in (range(0, 5), range(5, 12), range(12, 13))
    ]
    versions = _pin(client, uri, instants)
    seen: list[int] = []
    last = versions[0]
    seen += sorted(client.read("h", version=last).column("id").to_pylist())
    for version in versions[1:]:
        info = client.flight_info("h", version=version, since=last)
        parts = [client.read_endpoint(ep).read_all() for ep in info.endpoints]
        seen += [i for p in parts for i in p.column("id").to_pylist()]
        last = version
    assert sorted(seen) == list(range(13))


def test_refusals(client: HarnessClient, hudi_spark: Any, tmp_path) -> None:
    uri = str(tmp_path / "t")
    instant = hudi_spark.write(uri, _rows([1, 2], 1))
    client.create_table("h", COLUMNS)
    version = client.describe("h").version
    with pytest.raises(InvalidArgument, match="instant"):
        client.add_source("h", "s", "hudi", config={"uri": uri}, state={"instant": "yesterday"})
    with pytest.raises(InvalidArgument, match="no_such"):
        client.add_source("h", "s", "hudi", config={"uri": uri, "no_such": 1})
    assert client.describe("h").version == version
    # An instant the table never completed: nothing to read, said so (not an empty table).
    client.add_source("h", "s", "hudi", config={"uri": uri}, state={"instant": "20000101000000000"})
    with pytest.raises(NotFound, match="not a completed commit"):
        client.read("h")
    client.commit("h", updates=[{"source": "s", "state": {"instant": instant}}])
    assert sorted(client.read("h").column("id").to_pylist()) == [1, 2]


@pytest.mark.parametrize("table_version", ["6", "9"])
def test_streaming_delivers_records_updated_in_log_files(
    client: HarnessClient, hudi_spark: Any, tmp_path, table_version: str
) -> None:
    """Updates on a merge-on-read table land in log files. Before table version 8 a log file is
    named by its base file's instant, not by the commit that wrote it: its slice is read
    anyway, and the records committed after the earlier instant are the updated ones."""
    uri = str(tmp_path / "events")
    kw = {
        "table_type": MOR,
        "precombine": "ts",
        "options": {"hoodie.write.table.version": table_version},
    }
    first = hudi_spark.write(uri, _rows(list(range(0, 10)), 1), operation="insert", **kw)
    second = hudi_spark.write(uri, _rows(list(range(0, 5)), 2, 7.0), operation="upsert", **kw)
    assert _has_log_files(uri, second)
    v1, v2 = _pin(client, uri, [first, second])
    info = client.flight_info("h", version=v2, since=v1)
    got = pa.concat_tables([client.read_endpoint(ep).read_all() for ep in info.endpoints])
    assert _sorted(got) == _sorted(_rows(list(range(0, 5)), 2, 7.0))
