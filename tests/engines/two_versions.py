"""A harness table at two versions for the JVM readers of the Iceberg REST face: files +
Iceberg + versioned Postgres (v1), then a newer Iceberg snapshot (v2); v1 loaded once so its
snapshot is in the table's history."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.gateway.helpers import IcebergFixture, client_for, running_gateway, write_parquet
from tests.rest.helpers import get, versioned_pg_table

ARROW = pa.schema([("id", pa.int64()), ("region", pa.string())])


@dataclass
class TwoVersions:
    client: Any
    rest: str  # the REST face's URI
    v1: int
    v2: int
    v1_snapshot: int

    def rows(self, version: int) -> list[list[Any]]:
        t = self.client.read("t", version=version)
        ids, regions = t.column("id").to_pylist(), t.column("region").to_pylist()
        return sorted(map(list, zip(ids, regions, strict=True)))


@contextmanager
def two_versions(tmp_path: Path, pg_dsn: str) -> Iterator[TwoVersions]:
    write_parquet(tmp_path / "f" / "a.parquet", pa.table({"id": [1, 2], "region": ["f", "f"]}))
    ice = IcebergFixture(tmp_path / "ice")
    it = ice.create("r", ARROW)
    it.append(pa.table({"id": [10, 11], "region": ["i", "i"]}, schema=ARROW))
    pg, as_of = versioned_pg_table(pg_dsn, "VALUES (30, 'p'), (31, 'p')", "jvm")
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", reach={"any": True},
                         iceberg_rest_port=0, iceberg_rest_dir=str(tmp_path / "rest")) as (server, _):  # fmt: skip
        client = client_for(server)
        client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "region", "type": "string"}])  # fmt: skip
        client.add_source("t", "f", "files", config={"root": str(tmp_path / "f")},
                          state={"files": ["a.parquet"]})  # fmt: skip
        client.add_source("t", "i", "iceberg", config=ice.source_config("r"),
                          state={"snapshot_id": it.current_snapshot().snapshot_id})  # fmt: skip
        v1 = client.add_source("t", "p", "postgres", config={"dsn": pg_dsn, "table": pg},
                               state={"as_of": as_of})  # fmt: skip
        it.append(pa.table({"id": [12], "region": ["i"]}, schema=ARROW))
        v2 = client.commit("t", updates=[{"source": "i", "state": {"snapshot_id": it.current_snapshot().snapshot_id}}])  # fmt: skip
        rest = f"http://127.0.0.1:{server.rest.port}"
        status, body = get(f"{rest}/v1/namespaces/harness/tables/t?version={v1}")
        assert status == 200, body
        try:
            yield TwoVersions(client, rest, v1, v2, body["metadata"]["current-snapshot-id"])
        finally:
            client.close()
