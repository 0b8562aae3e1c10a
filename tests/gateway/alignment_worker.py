"""Run with ACERO_ALIGNMENT_HANDLING=error (Acero then fails instead of warning): reads through
the gateway, then DuckDB over the client's table, a ``flight`` source's residual filter, and
upserts whose uploaded batches the gateway groups by key (uploads arrive misaligned too)."""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.flight as fl

from tests.gateway.helpers import IcebergFixture, client_for, running_gateway, write_parquet

N = 300_000
DATA = pa.table(
    {
        "flag": pa.array(["A", "N", "R"] * (N // 3)),
        "qty": pa.array(range(N), pa.int64()).cast(pa.decimal128(25, 2)),
        "price": pa.array([float(i) for i in range(N)], pa.float64()),
    }
)
SCHEMA = [{"name": f.name, "type": str(f.type)} for f in DATA.schema]


class Upstream(fl.FlightServerBase):
    def get_flight_info(self, context, descriptor):  # type: ignore[no-untyped-def]
        return fl.FlightInfo(DATA.schema, descriptor, [fl.FlightEndpoint(b"a", [])], -1, -1)

    def do_get(self, context, ticket):  # type: ignore[no-untyped-def]
        return fl.RecordBatchStream(DATA)


def _upserts(client: object, root: Path) -> None:
    from clients import HarnessClient

    assert isinstance(client, HarnessClient)
    key = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.float64())])
    ice = IcebergFixture(root / "ice")
    ice.catalog.create_table("db.u", schema=key, properties={"format-version": "2"})
    client.create_table("u", key, primary_key=["id"])
    client.add_source("u", "ice", "iceberg", config=ice.source_config("u"))
    for start in (0, 500):  # the second upload updates half of the first one's keys
        ids = pa.array(range(start, start + 1000), pa.int64())
        client.put("u", pa.table({"id": ids, "v": pa.array([float(start)] * 1000)}), merge=True)
    got = client.read("u").sort_by("id")
    assert got.num_rows == 1500 and got.column("v")[999].as_py() == 500.0


def main() -> None:
    root = Path(tempfile.mkdtemp())
    write_parquet(root / "f" / "a.parquet", DATA, row_group_size=50_000)
    with (
        running_gateway(f"sqlite:///{root / 'c.db'}") as (server, _),
        Upstream("grpc://127.0.0.1:0") as up,
    ):
        threading.Thread(target=up.serve, daemon=True).start()
        client = client_for(server)
        client.create_table("t", SCHEMA)
        client.add_source(
            "t", "f", "files", config={"root": str(root / "f")}, state={"files": ["a.parquet"]}
        )
        client.create_table("p", SCHEMA)
        location = {"location": f"grpc://127.0.0.1:{up.port}", "descriptor": {"path": ["x"]}}
        client.add_source("p", "up", "flight", config=location)
        con = duckdb.connect()
        for table in ("t", "p"):
            got = client.read(table, filter="price >= 10")  # residual filter on the proxy
            con.register("x", got)
            n, qty = con.execute("SELECT count(*), sum(qty) FROM x WHERE price >= 0").fetchone()
            assert (n, qty) == (N - 10, sum(range(10, N))), (n, qty)
            con.unregister("x")
        _upserts(client, root)
        client.close()
    print("aligned")


if __name__ == "__main__":
    sys.exit(main())
