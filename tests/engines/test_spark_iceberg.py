"""Spark with Iceberg's own Spark runtime (``iceberg-spark-runtime-4.1_2.13:1.11.0`` from Maven
Central, on pyspark 4.1 in an environment of its own: the runtime supports Spark up to 4.1) reads
harness tables through the gateway's Iceberg REST face, a Spark user's most common route: the
latest version and an earlier one by snapshot id, equal to the harness's own reads."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from flight_gateway.protocol.errors import Unavailable
from planners.postgres.versioning import enable_versioning, server_now
from tests.gateway.helpers import IcebergFixture, client_for, running_gateway, write_parquet
from tests.rest.helpers import get
from tests.services import missing

pytestmark = pytest.mark.integration
ARROW = pa.schema([("id", pa.int64()), ("region", pa.string())])
SCRIPT = Path(__file__).with_name("spark_iceberg_read.py")


def _harness(client: Any, version: int) -> list[list[Any]]:
    t = client.read("t", version=version)
    return sorted(map(list, zip(t.column("id").to_pylist(), t.column("region").to_pylist(), strict=True)))  # fmt: skip


def test_spark_with_icebergs_runtime_reads_pinned_versions(tmp_path: Path, pg_dsn: str) -> None:
    import psycopg

    from flight_gateway.local.engines import ICEBERG_SPARK, fetch, java_home, spark_python

    try:
        runtime, python, jdk = (
            fetch(ICEBERG_SPARK),
            spark_python(),
            java_home(17, 21),
        )  # Spark 4.1's JDKs (Hadoop's login fails on 23+)
    except Unavailable as e:
        missing(f"Spark with Iceberg's runtime: {e}")
    write_parquet(tmp_path / "f" / "a.parquet", pa.table({"id": [1, 2], "region": ["f", "f"]}))
    ice = IcebergFixture(tmp_path / "ice")
    it = ice.create("r", ARROW)
    it.append(pa.table({"id": [10, 11], "region": ["i", "i"]}, schema=ARROW))
    pg = f"spark_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{pg}" (id bigint primary key, region text)')
        enable_versioning(conn, pg)
        conn.execute(f"INSERT INTO \"{pg}\" VALUES (30, 'p'), (31, 'p')")
        as_of = server_now(conn)
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
        assert status == 200
        old = body["metadata"]["current-snapshot-id"]
        env = {"JAVA_HOME": str(jdk), "PATH": f"{jdk / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
        out = subprocess.run([str(python), str(SCRIPT), str(runtime), rest, "t", str(old)],
                             capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert sorted(got["latest"]) == _harness(client, v2)
        assert sorted(got["old"]) == _harness(client, v1)
        assert sorted(got["old"]) != sorted(got["latest"])
        client.close()
