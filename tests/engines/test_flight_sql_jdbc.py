"""The gateway's Flight SQL face through Apache Arrow's Flight SQL JDBC driver (from Maven
Central), the route of DBeaver and other JDBC tools: statements, prepared statements with a
parameter, the DatabaseMetaData calls a SQL tool makes, and errors as SQLExceptions carrying the
gateway's message. The Java client is ``FlightSqlProbe.java``, run by Java's source launcher."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from flight_gateway.protocol.errors import Unavailable
from tests.gateway.helpers import client_for, running_gateway, write_parquet
from tests.services import missing

pytestmark = pytest.mark.integration
PROBE = Path(__file__).with_name("FlightSqlProbe.java")
READER = "reader-token-0123456789"
ADMIN = "admin-token-0123456789"


def _probe(port: int, token: str, *steps: tuple[str, ...]) -> list[dict[str, Any]]:
    from flight_gateway.local.engines import FLIGHT_SQL_JDBC, fetch, java_home

    try:
        driver, jdk = fetch(FLIGHT_SQL_JDBC), java_home(11)
    except Unavailable as e:
        missing(f"Flight SQL JDBC: {e}")
    url = f"jdbc:arrow-flight-sql://127.0.0.1:{port}?useEncryption=false&token={token}"
    out = subprocess.run(
        [str(jdk / "bin" / "java"), "--add-opens=java.base/java.nio=ALL-UNNAMED",
         "-cp", str(driver), str(PROBE), url, *("\t".join(s) for s in steps)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_jdbc_statements_metadata_and_errors(tmp_path: Path) -> None:
    tokens = {ADMIN: {"name": "admin", "admin": ["*"]}, READER: {"name": "r", "read": ["t"]}}
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", tokens=tokens, allow_anonymous=False,
                         reach={"any": True}) as (server, _):  # fmt: skip
        admin = client_for(server, token=ADMIN)
        for name, ids in (("t", [1, 2, 3]), ("secret", [9])):
            data = pa.table({"id": ids, "name": [f"n{i}" for i in ids],
                             "amount": [i * 0.5 for i in ids]})  # fmt: skip
            write_parquet(tmp_path / name / "a.parquet", data)
            admin.create_table(name, data.schema)
            admin.add_source(name, "f", "files", config={"root": str(tmp_path / name)},
                             state={"files": ["a.parquet"]})  # fmt: skip
        expected = admin.read("t").sort_by("id")
        query, prepared, meta, denied, bad = _probe(
            server.port, READER,
            ("query", "SELECT id, name, amount FROM t ORDER BY id"),
            ("prepared", "SELECT id, name FROM t WHERE id > ? ORDER BY id", "1"),
            ("metadata", "t"),
            ("fail", "SELECT * FROM secret"),
            ("fail", "SELEC id FROM t"),
        )  # fmt: skip
        admin.close()
    assert query["columns"] == ["id", "name", "amount"]
    assert query["rows"] == [list(r.values()) for r in expected.to_pylist()]
    assert prepared["rows"] == [[2, "n2"], [3, "n3"]]
    assert meta["tables"] == ["t"]  # the reader's tables only
    assert meta["columns"] == ["id", "name", "amount"]
    assert "secret" not in json.dumps(meta)
    assert meta["catalogs"] and meta["schemas"]
    assert denied["error"] and "secret" in denied["error"]
    assert bad["error"] and "syntax" in bad["error"].lower()
