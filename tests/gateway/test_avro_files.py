"""Avro container files in a ``files`` source: logical types, projection and filters; DoPut
refused clearly; a direct read falls back to the gateway with the same rows."""

from __future__ import annotations

import datetime as dt
import decimal

import fastavro
import pyarrow as pa
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import InvalidArgument

SCHEMA = {
    "type": "record",
    "name": "order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        },
        {"name": "note", "type": ["null", "string"]},
    ],
}


def _records(ids: range) -> list[dict]:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return [
        {
            "id": i,
            "at": t0 + dt.timedelta(minutes=i),
            "day": None if i % 3 == 0 else dt.date(2026, 1, 1 + i % 28),
            "price": decimal.Decimal(i) / 4,
            "note": None if i % 2 else f"n{i}",
        }
        for i in ids
    ]


@pytest.fixture
def avro_table(client: HarnessClient, tmp_path) -> HarnessClient:
    for n, ids in (("a.avro", range(0, 50)), ("b.avro", range(50, 80))):
        with open(tmp_path / n, "wb") as out:
            fastavro.writer(out, fastavro.parse_schema(SCHEMA), _records(ids))
    client.create_table(
        "orders",
        [
            {"name": "id", "type": "int64"},
            {"name": "at", "type": "timestamp[us, tz=UTC]"},
            {"name": "day", "type": "date32"},
            {"name": "price", "type": "decimal128(10, 2)"},
            {"name": "note", "type": "string"},
        ],
    )
    client.add_source(
        "orders",
        "avro",
        "files",
        config={"root": str(tmp_path), "format": "avro", "direct": True},
        state={"files": ["a.avro", "b.avro"]},
    )
    return client


def test_avro_types_projection_and_filter(avro_table: HarnessClient) -> None:
    whole = avro_table.read("orders").sort_by("id")
    assert whole.num_rows == 80
    assert whole.schema.field("price").type == pa.decimal128(10, 2)
    assert whole.column("price")[5].as_py() == decimal.Decimal("1.25")
    assert whole.column("day")[3].as_py() is None
    got = avro_table.read(
        "orders", columns=["note", "id"], filter="id >= 40 AND id < 60 AND note IS NOT NULL"
    )
    assert got.column_names == ["note", "id"]
    assert sorted(got.column("id").to_pylist()) == list(range(40, 60, 2))


def test_avro_direct_read_falls_back_to_the_gateway(avro_table: HarnessClient) -> None:
    info = avro_table.flight_info("orders", direct=True)
    assert not any(avro_table.direct_task(ep) for ep in info.endpoints)
    direct = avro_table.read("orders", direct=True).sort_by("id")
    assert direct.equals(avro_table.read("orders").sort_by("id"))


def test_doput_into_avro_is_refused(avro_table: HarnessClient) -> None:
    version = avro_table.describe("orders").version
    with pytest.raises(InvalidArgument, match="Parquet files only"):
        avro_table.put("orders", pa.table({"id": [1]}), source="avro")
    assert avro_table.describe("orders").version == version
