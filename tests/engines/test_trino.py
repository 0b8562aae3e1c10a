"""Trino (476, from Maven Central) reads harness tables through the gateway's Iceberg REST face:
pinned versions equal to the harness's own reads (latest and ``FOR VERSION AS OF``), a token's
unreadable tables invisible, and the 22 TPC-H queries over tables spread across five source
kinds equal to DuckDB's answers on the same rows."""

from __future__ import annotations

import decimal
import json
import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from trino.exceptions import TrinoUserError

from benchmarks import tpch_tables as tpch
from planners.postgres.versioning import server_now
from tests.gateway.helpers import IcebergFixture, client_for, running_gateway, write_parquet
from tests.gateway.kafka_helpers import new_topic, produce
from tests.rest.helpers import get, versioned_pg_table

pytestmark = pytest.mark.integration
ARROW = pa.schema([("id", pa.int64()), ("region", pa.string())])


def _rows(cur: Any, sql: str) -> list[tuple[Any, ...]]:
    cur.execute(sql)
    return sorted(tuple(r) for r in cur.fetchall())


def _harness(client: Any, table: str, version: int | None = None) -> list[tuple[Any, ...]]:
    t = client.read(table, version=version)
    return sorted(zip(t.column("id").to_pylist(), t.column("region").to_pylist(), strict=True))


def _catalog() -> str:
    return f"h_{uuid.uuid4().hex[:8]}"


def test_trino_reads_pinned_versions_of_every_kind(
    trino: Any, tmp_path: Path, pg_dsn: str, kafka_bootstrap: str
) -> None:
    import psycopg

    write_parquet(tmp_path / "f" / "a.parquet", pa.table({"id": [1, 2], "region": ["f", "f"]}))
    ice = IcebergFixture(tmp_path / "ice")
    it = ice.create("r", ARROW)
    it.append(pa.table({"id": [10, 11], "region": ["i", "i"]}, schema=ARROW))
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, [json.dumps({"id": 20 + i, "region": "k"}).encode() for i in range(5)])  # fmt: skip
    pg, as_of = versioned_pg_table(pg_dsn, "VALUES (30, 'p'), (31, 'p')", "trino")
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", reach={"any": True},
                         iceberg_rest_port=0, iceberg_rest_dir=str(tmp_path / "rest")) as (server, _):  # fmt: skip
        client = client_for(server)
        client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "region", "type": "string"}])  # fmt: skip
        client.add_source("t", "f", "files", config={"root": str(tmp_path / "f")},
                          state={"files": ["a.parquet"]})  # fmt: skip
        client.add_source("t", "i", "iceberg", config=ice.source_config("r"),
                          state={"snapshot_id": it.current_snapshot().snapshot_id})  # fmt: skip
        kafka = {"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0}
        client.add_source("t", "k", "kafka", config=kafka, state={"low": 0, "high": 3})
        v1 = client.add_source("t", "p", "postgres", config={"dsn": pg_dsn, "table": pg},
                               state={"as_of": as_of})  # fmt: skip
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DELETE FROM "{pg}" WHERE id = 30')
            later = server_now(conn)
        v2 = client.commit("t", updates=[{"source": "k", "state": {"low": 1, "high": 5}},
                                         {"source": "p", "state": {"as_of": later}}])  # fmt: skip
        rest = f"http://127.0.0.1:{server.rest.port}"
        # Time travel lists the kept versions loaded before (docs/engines.md): load v1 once.
        assert get(f"{rest}/v1/namespaces/harness/tables/t?version={v1}")[0] == 200
        with trino.iceberg_catalog(_catalog(), rest) as cat:
            conn = trino.connect(cat, "harness")
            cur = conn.cursor()
            assert _rows(cur, "SELECT id, region FROM t") == _harness(client, "t", v2)
            snap = _rows(cur, 'SELECT snapshot_id FROM "t$snapshots"')
            v1_snap = (server.core.reads.snapshot("t").table_id << 32) | v1
            assert (v1_snap,) in snap
            old = _rows(cur, f"SELECT id, region FROM t FOR VERSION AS OF {v1_snap}")
            assert old == _harness(client, "t", v1)
            assert old != _harness(client, "t", v2)
            conn.close()
        client.close()


def test_a_tokens_unreadable_tables_are_invisible(trino: Any, tmp_path: Path) -> None:
    admin, reader = "admin-token-0123456789", "reader-token-0123456789"
    tokens = {admin: {"name": "admin", "admin": ["*"]}, reader: {"name": "r", "read": ["t"]}}
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", tokens=tokens, allow_anonymous=False,
                         reach={"any": True}, iceberg_rest_port=0) as (server, _):  # fmt: skip
        client = client_for(server, token=admin)
        for name, ids in (("t", [1, 2]), ("secret", [3])):
            write_parquet(tmp_path / name / "a.parquet", pa.table({"id": ids, "region": ["x"] * len(ids)}))  # fmt: skip
            client.create_table(name, [{"name": "id", "type": "int64"}, {"name": "region", "type": "string"}])  # fmt: skip
            client.add_source(name, "f", "files", config={"root": str(tmp_path / name)},
                              state={"files": ["a.parquet"]})  # fmt: skip
        rest = f"http://127.0.0.1:{server.rest.port}"
        with trino.iceberg_catalog(_catalog(), rest, token=reader) as cat:
            conn = trino.connect(cat, "harness")
            cur = conn.cursor()
            assert _rows(cur, "SHOW TABLES") == [("t",)]
            assert _rows(cur, "SELECT id FROM t") == [(1,), (2,)]
            with pytest.raises(TrinoUserError, match=r"(?i)secret.*does not exist"):
                _rows(cur, "SELECT id FROM secret")
            conn.close()
        client.close()


# ---------------------------------------------------------------------- TPC-H

SF = 0.01


@pytest.fixture(scope="module")
def tpch_rest(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str) -> Iterator[tuple[str, Any]]:
    root = tmp_path_factory.mktemp("tpch-trino")
    oracle = tpch.generate(SF)
    with running_gateway(f"sqlite:///{root / 'catalog.db'}", reach={"any": True},
                         iceberg_rest_port=0, iceberg_rest_dir=str(root / "rest")) as (server, _):  # fmt: skip
        client = client_for(server)
        tpch.load(client, oracle, root, pg_dsn)
        yield f"http://127.0.0.1:{server.rest.port}", oracle
        client.close()
    oracle.close()


def _same(got: Any, expected: Any) -> bool:
    """Equal, where Trino's decimal results (avg of a decimal keeps its scale) are compared
    with DuckDB's doubles to within half a unit of that scale."""
    if isinstance(got, decimal.Decimal) and isinstance(expected, float):
        exponent = got.as_tuple().exponent
        unit = 10.0**exponent if isinstance(exponent, int) else 0.0
        return abs(float(got) - expected) <= unit / 2 + 1e-9 * abs(expected)
    if isinstance(got, float) or isinstance(expected, float):
        return math.isclose(float(got), float(expected), rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(got, decimal.Decimal) or isinstance(expected, decimal.Decimal):
        return decimal.Decimal(got) == decimal.Decimal(expected)
    return bool(got == expected)


@pytest.mark.parametrize("number", range(1, 23))
def test_tpch_through_trino_equals_duckdb(
    trino: Any, tpch_rest: tuple[str, Any], number: int
) -> None:
    rest, oracle = tpch_rest
    sql = dict(tpch.queries(oracle))[number]
    expected = oracle.execute(sql).fetchall()
    text = dict(tpch.trino_queries(oracle))[number]
    with trino.iceberg_catalog(_catalog(), rest) as cat:
        conn = trino.connect(cat, "harness")
        cur = conn.cursor()
        cur.execute(text)
        got = [tuple(r) for r in cur.fetchall()]
        conn.close()
    if "order by" not in sql.lower():
        got, expected = sorted(got, key=repr), sorted(expected, key=repr)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert len(g) == len(e) and all(_same(x, y) for x, y in zip(g, e, strict=True)), (g, e)
