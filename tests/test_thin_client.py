"""The Python client is thin: ``from clients import HarnessClient`` with ``read``, ``put`` and
``sql`` loads the gateway's vocabulary and pyarrow, no server library (it loaded 924 modules,
SQLAlchemy and sqlglot among them, to pack one Flight SQL protobuf). Counted in a fresh
interpreter against a real gateway process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.processes import GatewayProcess
from clients import HarnessClient

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ["sqlalchemy", "sqlglot", "confluent_kafka", "psycopg", "pyiceberg", "duckdb", "planners",
         "flight_gateway.core", "flight_gateway.catalog", "flight_gateway.faces"]  # fmt: skip
SCRIPT = """
import json, sys


class NoPandas:  # as installed without pandas (see below)
    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(name)


sys.meta_path.insert(0, NoPandas())
import pyarrow as pa
from clients import HarnessClient
with HarnessClient(sys.argv[1]) as c:
    assert c.read("t").num_rows == 3
    c.put("t", pa.table({"id": [4]}), commit_id="thin-1")
    assert c.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 4}]
print(json.dumps(sorted(sys.modules)))
"""
# pyarrow itself imports pandas, when installed, the first time it builds a table (its pandas
# shim), whoever calls it: 377 modules with pandas' own dependencies. The count is of a client
# installed without pandas (the ``dataframes`` extra), which the script simulates.


@pytest.mark.integration
def test_a_client_loads_no_server_library(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": [1, 2, 3]}), data / "a.parquet")
    gw = GatewayProcess(f"sqlite:///{tmp_path / 'c.db'}", tmp_path, reach={"paths": [str(data)]})
    gw.start()
    try:
        with HarnessClient(gw.uri) as setup:
            setup.create_table("t", [{"name": "id", "type": "int64"}])
            setup.add_source("t", "f", "files", config={"root": str(data), "format": "parquet"},
                             state={"files": ["a.parquet"]})  # fmt: skip
        out = subprocess.run([sys.executable, "-c", SCRIPT, gw.uri], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    finally:
        gw.stop()
    assert out.returncode == 0, out.stderr[-3000:]
    modules = json.loads(out.stdout.splitlines()[-1])
    loaded = [h for h in HEAVY if any(m == h or m.startswith(h + ".") for m in modules)]
    assert loaded == [], loaded
    assert len(modules) < 300, len(modules)
