"""The Iceberg REST face: pyiceberg's RestCatalog and DuckDB's iceberg extension read a table
made of files + Iceberg + Kafka + versioned Postgres at two versions, equal to the harness's
own read at those versions; a table the caller may not read is neither listed nor loadable;
writes are refused."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from planners.postgres.versioning import enable_versioning, server_now
from tests.gateway.helpers import IcebergFixture, client_for, running_gateway, write_parquet
from tests.gateway.kafka_helpers import new_topic, produce

pytestmark = pytest.mark.integration
TOKENS = {
    "reader-token-0123456789": {"name": "reader", "read": ["t"]},
    "admin-token-0123456789": {"name": "admin", "admin": ["*"]},
}
ARROW = pa.schema([("id", pa.int64()), ("region", pa.string())])


def _table(client: Any, tmp_path: Path, pg_dsn: str, bootstrap: str) -> tuple[str, str]:
    write_parquet(tmp_path / "f" / "a.parquet", pa.table({"id": [1, 2], "region": ["f", "f"]}))
    ice = IcebergFixture(tmp_path / "ice")
    t = ice.create("r", ARROW)
    t.append(pa.table({"id": [3], "region": ["i"]}, schema=ARROW))
    pg = f"rest_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{pg}" (id bigint, region text)')
        enable_versioning(conn, pg)
        conn.execute(f"INSERT INTO \"{pg}\" VALUES (4, 'p')")
        as_of = server_now(conn)
    topic = new_topic(bootstrap)
    produce(bootstrap, topic, [json.dumps({"id": 5, "region": "k"}).encode()])
    client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "region", "type": "string"}])  # fmt: skip
    kafka = {"bootstrap_servers": bootstrap, "topic": topic, "partition": 0}
    client.commit(
        "t",
        add_sources=[
            {
                "name": "f",
                "kind": "files",
                "config": {"root": str(tmp_path / "f")},
                "state": {"files": ["a.parquet"]},
            },
            {
                "name": "i",
                "kind": "iceberg",
                "config": ice.source_config("r"),
                "state": {"snapshot_id": t.current_snapshot().snapshot_id},
            },
            {
                "name": "p",
                "kind": "postgres",
                "config": {"dsn": pg_dsn, "table": pg},
                "state": {"as_of": as_of},
            },
            {"name": "k", "kind": "kafka", "config": kafka, "state": {"low": 0, "high": 1}},
        ],
    )
    client.create_table("secret", [{"name": "id", "type": "int64"}])
    return pg, topic


def _rows(t: pa.Table) -> list[tuple[int, str]]:
    return sorted(zip(t.column("id").to_pylist(), t.column("region").to_pylist(), strict=True))


def _duckdb_rows(uri: str, token: str) -> list[tuple[int, str]]:
    """The table through DuckDB's iceberg extension attached to the REST endpoint."""
    import duckdb
    import duckdb_extensions

    con = duckdb.connect(config={"autoinstall_known_extensions": "false"})
    try:
        for name in ("httpfs", "avro", "iceberg"):
            duckdb_extensions.import_extension(name, con=con)
            con.load_extension(name)
        con.execute(f"CREATE SECRET harness (TYPE iceberg, TOKEN '{token}')")
        con.execute(f"ATTACH 'harness' AS h (TYPE iceberg, ENDPOINT '{uri}', SECRET harness)")
        return [tuple(r) for r in con.execute("SELECT id, region FROM h.harness.t ORDER BY ALL").fetchall()]  # fmt: skip
    finally:
        con.close()


def test_rest_clients_read_pinned_versions(
    tmp_path: Path, pg_dsn: str, kafka_bootstrap: str
) -> None:
    from pyiceberg.catalog.rest import RestCatalog

    config = {
        "tokens": TOKENS,
        "reach": {"any": True},
        "iceberg_rest_port": 0,
        "iceberg_rest_dir": str(tmp_path / "rest"),
    }
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", allow_anonymous=False, **config) as (server, _):  # fmt: skip
        admin = client_for(server, "admin-token-0123456789")
        pg, topic = _table(admin, tmp_path, pg_dsn, kafka_bootstrap)
        v1 = admin.describe("t").version
        first = _rows(admin.read("t", version=v1))
        # a second version: more Kafka rows and a Postgres change
        produce(kafka_bootstrap, topic, [json.dumps({"id": 6, "region": "k"}).encode()])
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"INSERT INTO \"{pg}\" VALUES (7, 'p')")
            as_of = server_now(conn)
        admin.commit("t", updates=[{"source": "k", "state": {"low": 0, "high": 2}}, {"source": "p", "state": {"as_of": as_of}}])  # fmt: skip
        v2 = admin.describe("t").version
        second = _rows(admin.read("t", version=v2))
        assert len(second) == len(first) + 2

        uri = f"http://127.0.0.1:{server.rest.port}"
        rest = RestCatalog("harness", uri=uri, token="reader-token-0123456789")
        assert rest.list_tables("harness") == [("harness", "t")]  # not "secret"
        table = rest.load_table("harness.t")
        assert _rows(table.scan().to_arrow()) == second
        # time travel: the first version, loaded by version, then by its snapshot id
        request = urllib.request.Request(f"{uri}/v1/namespaces/harness/tables/t?version={v1}", headers={"Authorization": "Bearer reader-token-0123456789"})  # fmt: skip
        meta = json.loads(urllib.request.urlopen(request).read())["metadata"]
        snap_v1 = meta["current-snapshot-id"]
        latest = rest.load_table("harness.t")  # the latest again, v1 in its history
        assert _rows(latest.scan().to_arrow()) == second
        assert _rows(latest.scan(snapshot_id=snap_v1).to_arrow()) == first
        assert _duckdb_rows(uri, "reader-token-0123456789") == second
        # the table moves on; a load pinned to v2 still serves v2
        admin.commit("t", updates=[{"source": "k", "state": {"low": 1, "high": 2}}])
        request = urllib.request.Request(f"{uri}/v1/namespaces/harness/tables/t?version={v2}", headers={"Authorization": "Bearer reader-token-0123456789"})  # fmt: skip
        pinned = json.loads(urllib.request.urlopen(request).read())["metadata"]
        moved = rest.load_table("harness.t")
        assert _rows(moved.scan(snapshot_id=pinned["current-snapshot-id"]).to_arrow()) == second
        assert len(_rows(moved.scan().to_arrow())) == len(second) - 1  # Kafka's first row moved out
        with pytest.raises(Exception, match=r"NoSuchTable|404|not found"):
            rest.load_table("harness.secret")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(f"{uri}/v1/namespaces/harness/tables", data=b"{}", method="POST", headers={"Authorization": "Bearer admin-token-0123456789"}))  # fmt: skip
        assert refused.value.code == 403
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            urllib.request.urlopen(f"{uri}/v1/namespaces/harness/tables")
        assert anonymous.value.code == 401
        admin.close()
