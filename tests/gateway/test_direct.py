"""Direct tasks: the client reads cold files itself, and gets exactly the rows of the Flight path
— at every pinned version, with filters, projections and renamed, added and widened columns."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from clients import HarnessClient
from flight_gateway.protocol.direct import DirectTask, verify_direct
from flight_gateway.protocol.errors import InvalidArgument, Unauthorized
from tests.gateway.helpers import IcebergFixture, client_for, running_gateway, write_parquet

ARROW = pa.schema([("id", pa.int32()), ("name", pa.string()), ("amount", pa.float64())])
SCHEMA = [
    {"name": "id", "type": "int32"},
    {"name": "name", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "_source", "type": "string"},
]


def rows(ids: range) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(list(ids), pa.int32()),
            "name": [None if i % 5 == 0 else f"n{i}" for i in ids],
            "amount": [i * 0.5 for i in ids],
        },
        schema=ARROW,
    )


@pytest.fixture
def mixed(client: HarnessClient, tmp_path: Path, iceberg: IcebergFixture) -> dict:
    """A table over files and Iceberg with direct reads allowed, evolved over three versions."""
    (tmp_path / "f").mkdir()
    write_parquet(tmp_path / "f" / "a.parquet", rows(range(0, 50)))
    ice = iceberg.create("d", ARROW)
    ice.append(rows(range(100, 150)))
    client.create_table("t", SCHEMA)
    client.add_source(
        "t",
        "files",
        "files",
        config={"root": str(tmp_path / "f"), "direct": True},
        state={"files": ["a.parquet"]},
    )
    client.add_source(
        "t",
        "ice",
        "iceberg",
        config={**iceberg.source_config("d"), "direct": True},
        state={"snapshot_id": ice.current_snapshot().snapshot_id},
    )
    v1 = client.describe("t").version
    # Evolve: rename name -> label, add extra, widen id; new data carries the new names/types.
    client.evolve_schema(
        "t",
        [
            {"op": "rename_column", "name": "name", "new_name": "label"},
            {"op": "add_column", "name": "extra", "type": "int64"},
            {"op": "widen_type", "name": "id", "type": "int64"},
        ],
    )
    newer = pa.table(
        {
            "id": pa.array(range(50, 60), pa.int64()),
            "label": ["new"] * 10,
            "amount": [1.0] * 10,
            "extra": pa.array(range(10), pa.int64()),
        }
    )
    write_parquet(tmp_path / "f" / "b.parquet", newer)
    client.commit(
        "t", updates=[{"source": "files", "state": {"files": ["a.parquet", "b.parquet"]}}]
    )
    ice = iceberg.catalog.load_table("db.d")
    ice.append(
        pa.table(
            {
                "id": pa.array([200, 201], pa.int64()),
                "name": ["x", None],
                "amount": [2.0, 3.0],
                "extra": pa.array([7, 8], pa.int64()),
            },
            schema=ice.schema().as_arrow(),
        )
    )
    client.commit(
        "t",
        updates=[{"source": "ice", "state": {"snapshot_id": ice.current_snapshot().snapshot_id}}],
    )
    return {"v1": v1, "v3": client.describe("t").version}


def both(client: HarnessClient, **read: object) -> tuple[pa.Table, pa.Table]:
    flight = client.read("t", **read)
    direct = client.read("t", direct=True, **read)
    key = [n for n in ("id", "label", "name") if n in flight.column_names][
        :1
    ] or flight.column_names[:1]
    return flight.sort_by(key[0]), direct.sort_by(key[0])


@pytest.mark.parametrize(
    "read",
    [
        {},
        {"columns": ["amount", "id"]},
        {"filter": "id >= 40 AND id < 120"},
        {"filter": "label IS NULL OR extra > 3", "columns": ["id"]},
        {"filter": "NOT (amount BETWEEN 1 AND 30)", "columns": ["id", "_source"]},
        {"filter": "label LIKE 'n1%' OR id IN (200, 201)"},
        {"sources": ["ice"], "filter": "id > 120"},
    ],
)
def test_direct_reads_equal_flight_reads(client: HarnessClient, mixed: dict, read: dict) -> None:
    new_names = "label" in str(read) or "extra" in str(read)  # the schema of v3 only
    for version in (mixed["v3"],) if new_names else (mixed["v1"], mixed["v3"]):
        flight, direct = both(client, version=version, **read)
        assert direct.schema == flight.schema
        assert direct.equals(flight), f"version {version}: {read}"
    info = client.flight_info("t", direct=True, **read)
    assert all(client.direct_task(ep) is not None for ep in info.endpoints)


def test_no_direct_task_unless_the_source_allows_and_the_caller_asks(
    client: HarnessClient, mixed: dict, tmp_path: Path
) -> None:
    assert all(not ep.app_metadata for ep in client.flight_info("t").endpoints)
    write_parquet(tmp_path / "f" / "c.parquet", rows(range(300, 305)))
    client.add_source(
        "t", "closed", "files", config={"root": str(tmp_path / "f")}, state={"files": ["c.parquet"]}
    )
    info = client.flight_info("t", direct=True, sources=["closed"])
    assert [client.direct_task(ep) for ep in info.endpoints] == [None]
    assert client.read("t", direct=True, sources=["closed"]).num_rows == 5  # through Flight


def test_dedupe_reads_fall_back_to_flight(client: HarnessClient, tmp_path: Path) -> None:
    write_parquet(tmp_path / "k.parquet", pa.table({"id": [1, 1, 2], "v": ["a", "b", "c"]}))
    client.create_table(
        "k", [{"name": "id", "type": "int64"}, {"name": "v", "type": "string"}], primary_key=["id"]
    )
    client.add_source(
        "k",
        "f",
        "files",
        config={"root": str(tmp_path), "direct": True},
        state={"files": ["k.parquet"]},
    )
    flight = client.read("k", dedupe=True).sort_by("id")
    assert client.read("k", dedupe=True, direct=True).sort_by("id").equals(flight)
    assert flight.to_pylist() == [{"id": 1, "v": "b"}, {"id": 2, "v": "c"}]


def test_tampered_and_expired_direct_tasks_are_refused(client: HarnessClient, mixed: dict) -> None:
    ep = client.flight_info("t", direct=True).endpoints[0]
    token = json.loads(ep.app_metadata)["direct"]
    prefix, body, sig = token.split(".")
    payload = json.loads(__import__("base64").urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    payload["files"] = ["/etc/passwd"]
    forged_body = (
        __import__("base64").urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    )
    with pytest.raises(InvalidArgument, match="signature is invalid"):
        verify_direct(f"{prefix}.{forged_body}.{sig}", client.public_key)
    task = verify_direct(token, client.public_key)
    assert isinstance(task, DirectTask)
    with pytest.raises(InvalidArgument, match="expired"):
        verify_direct(token, client.public_key, now=time.time() + 10 * 3600)


def test_a_caller_without_read_permission_gets_no_direct_task(
    tmp_path: Path, iceberg: IcebergFixture
) -> None:
    (tmp_path / "data").mkdir()
    write_parquet(tmp_path / "data" / "a.parquet", rows(range(3)))
    tokens = {"admin": {"name": "admin", "admin": ["*"]}, "other": {"name": "o", "read": ["x"]}}
    with (
        running_gateway(
            f"sqlite:///{tmp_path / 'c.db'}",
            tokens=tokens,
            allow_anonymous=False,
            reach={"paths": [str(tmp_path / "data")]},
        ) as (server, _),
        client_for(server, "admin") as admin,
        client_for(server, "other") as other,
    ):
        admin.create_table("t", SCHEMA[:3])
        admin.add_source(
            "t",
            "f",
            "files",
            config={"root": str(tmp_path / "data"), "direct": True},
            state={"files": ["a.parquet"]},
        )
        assert admin.read("t", direct=True).num_rows == 3
        with pytest.raises(Unauthorized):
            other.flight_info("t", direct=True)
        raw = fl.connect(f"grpc://127.0.0.1:{server.port}")
        with pytest.raises(fl.FlightUnauthenticatedError):
            raw.get_flight_info(fl.FlightDescriptor.for_command(b'{"table": "t", "direct": true}'))
