"""Stateless replicas: a ticket planned on one gateway is served by another sharing the catalog."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tests.gateway.helpers import client_for, running_gateway, write_parquet


@pytest.mark.integration
def test_ticket_served_by_other_replica(catalog_url: str, tmp_path: Path) -> None:
    write_parquet(tmp_path / "a.parquet", pa.table({"id": pa.array(range(50), pa.int64())}))
    key = "shared-ticket-key-for-replicas"
    with (
        running_gateway(catalog_url, ticket_key=key) as (a, _),
        running_gateway(catalog_url, ticket_key=key) as (b, _),
    ):
        ca, cb = client_for(a), client_for(b)
        ca.create_table("t", [{"name": "id", "type": "int64"}])
        ca.add_source(
            "t", "f", "files", config={"root": str(tmp_path)}, state={"files": ["a.parquet"]}
        )
        info = ca.flight_info("t", filter="id < 10")
        with fl.connect(f"grpc://127.0.0.1:{b.port}") as raw_b:
            got = raw_b.do_get(info.endpoints[0].ticket).read_all()
        assert sorted(got.column("id").to_pylist()) == list(range(10))
        assert cb.list_tables() == ["t"]
        ca.close()
        cb.close()
    with (
        running_gateway(catalog_url, ticket_key="another-key-entirely-123") as (c, _),
        fl.connect(f"grpc://127.0.0.1:{c.port}") as raw_c,
        pytest.raises(pa.ArrowInvalid, match="signature"),
    ):
        raw_c.do_get(info.endpoints[0].ticket).read_all()
