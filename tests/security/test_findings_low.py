"""One test per low-severity finding of the security audit: each failed before its fix."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import pyarrow as pa
import pyarrow.flight as fl
import pytest
import sqlglot

from clients import HarnessClient
from flight_gateway.app import GatewayConfig
from flight_gateway.cli import main
from flight_gateway.core import metrics
from flight_gateway.faces.flightsql.handles import HandleSealer
from flight_gateway.protocol.errors import InvalidArgument, NotFound
from flight_gateway.protocol.flightsql import pack, pb
from tests.gateway.helpers import client_for, running_gateway, write_parquet
from tests.security.test_findings import files_table, secure

# ---------------------------------------------------------------- 1. YAML aliases in apply

# The "billion laughs" shape, kept small: a regression must fail the test, not exhaust memory.
LAUGHS = """\
tables:
  - name: t
    schema:
      - {name: id, type: int64}
    properties:
      a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
      b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
      c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
      d: [*c, *c, *c, *c, *c, *c, *c, *c, *c]
"""
MERGE_KEY = """\
tables:
  - &base
    name: t
    schema: []
  - <<: *base
    name: u
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (LAUGHS, "line 6: YAML anchor &a is not allowed"),
        (MERGE_KEY, "line 2: YAML anchor &base is not allowed"),
        ("tables:\n  - name: t\n    schema: *nothing\n", "line 3: YAML alias *nothing"),
    ],
)
def test_apply_refuses_yaml_anchors_and_aliases(
    capsys: pytest.CaptureFixture[str],
    client: HarnessClient,
    tmp_path: Path,
    text: str,
    message: str,
) -> None:
    f = tmp_path / "tables.yaml"
    f.write_text(text)
    code = main(["apply", "--uri", client.uri, str(f)])
    out, err = capsys.readouterr()
    assert code == 1 and message in err and not out
    assert client.list_tables() == []  # nothing applied


# ---------------------------------------------------------------- 2. metrics label cardinality


def _commit_tables() -> set[str]:
    return {
        s.labels["table"]
        for m in metrics.REGISTRY.collect()
        if m.name == "harness_commits"
        for s in m.samples
    }


def test_commits_on_tables_that_do_not_exist_add_no_metric_series(tmp_path: Path) -> None:
    with secure(tmp_path) as c:
        files_table(c, tmp_path)
        made_up = [f"t{uuid.uuid4().hex}" for _ in range(50)]
        for name in made_up:
            with pytest.raises(NotFound):
                c["admin"].commit(name, properties={"x": 1})
            with pytest.raises(InvalidArgument, match="changes nothing"):
                c["writer"].commit(name)
        seen = _commit_tables()
        assert not seen & set(made_up)
        assert metrics.UNKNOWN_TABLE in seen
        # A table that exists keeps its own label, failed commits included.
        with pytest.raises(InvalidArgument, match="changes nothing"):
            c["writer"].commit("t")
        assert "t" in _commit_tables()


# ---------------------------------------------------------------- 3. nameless tokens and certs


@pytest.mark.parametrize(
    ("tokens", "certs", "message"),
    [
        ({"tok-a": {"read": ["*"]}}, {}, "token #1 needs a non-empty 'name'"),
        ({"tok-a": {"name": "a"}, "tok-b": {"name": " "}}, {}, "token #2 needs a non-empty"),
        ({"tok-a": {"name": "a"}, "tok-b": {"name": "a"}}, {}, r"principal name\(s\) \['a'\]"),
        ({}, {"spark-job": {"read": ["t"]}}, "certificate 'spark-job' needs a non-empty 'name'"),
        ({"tok-a": {"name": "job"}}, {"spark-job": {"name": "job"}}, "more than one token"),
        ({"tok-a": {"name": "anonymous"}}, {}, "anonymous callers' principal"),
    ],
)
def test_every_token_and_certificate_needs_its_own_name(
    tokens: dict[str, Any], certs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as e:
        GatewayConfig(tokens=tokens, certs=certs, ticket_key="k" * 32)
    assert "tok-" not in str(e.value)  # tokens are secrets: never in an error


def test_a_config_file_with_nameless_tokens_does_not_start(tmp_path: Path) -> None:
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps({"tokens": {"one": {"read": ["*"]}, "two": {"read": ["*"]}}}))
    with pytest.raises(ValueError, match="token #1 needs a non-empty 'name'"):
        GatewayConfig.load(str(path), ticket_key="k" * 32)


# ---------------------------------------------------------------- 4. commit fields of wrong types


WRONG_TYPES = [
    ("summary", "x"),
    ("summary", 1),
    ("summary", ["x"]),
    ("summary", [["a", 1]]),
    ("external_state", "x"),
    ("external_state", [["a", 1]]),
    ("external_state", True),
    ("properties", "x"),
    ("properties", [1]),
    ("add_sources", {"name": "g", "kind": "files"}),
    ("add_sources", [1]),
    ("remove_sources", [1]),
    ("remove_sources", {"f": 1}),
    ("remove_sources", [None]),
    ("updates", "x"),
    ("updates", [["f", {}]]),
    ("schema_changes", {"op": "add_column"}),
]


def test_commit_fields_of_the_wrong_json_type_are_invalid_argument(tmp_path: Path) -> None:
    with secure(tmp_path) as c:
        files_table(c, tmp_path)
        before = c["reader"].describe("t").version
        with pytest.raises(InvalidArgument, match="summary must be a JSON object, got a string"):
            c["admin"].commit("t", properties={"x": 1}, summary="x")
        for field, value in WRONG_TYPES:
            body = {"updates": [{"source": "f", "state": {"files": ["a.parquet"]}}], field: value}
            with pytest.raises(InvalidArgument):
                c["admin"].commit("t", **body)
        assert c["reader"].describe("t").version == before


# ---------------------------------------------------------------- 5. Flight SQL introspection


@pytest.fixture
def sql_table(client: HarnessClient, tmp_path: Path) -> HarnessClient:
    """``t`` with a column named like a denied function (columns stay allowed)."""
    write_parquet(tmp_path / "t.parquet", pa.table({"id": [1, 2], "version": ["a", "b"]}))
    client.create_table(
        "t", [{"name": "id", "type": "int64"}, {"name": "version", "type": "string"}]
    )
    client.add_source(
        "t", "f", "files", config={"root": str(tmp_path)}, state={"files": ["t.parquet"]}
    )
    return client


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT current_setting('temp_directory') AS d FROM t",
        "SELECT id FROM t WHERE current_setting('temp_directory') IS NOT NULL",
        "SELECT ('temp_directory').current_setting() FROM t",
        "SELECT main.current_setting('temp_directory') FROM t",
        "SELECT \"CURRENT_SETTING\"('temp_directory') FROM t",
        "SELECT getvariable('x') FROM t",
        "SELECT version() FROM t",
        "SELECT current_query() FROM t",
        "SELECT current_database(), current_schemas(true) FROM t",
        "SELECT pg_typeof(id) FROM t",
        "SELECT has_table_privilege('t', 'SELECT') FROM t",
        "SELECT list_transform(['temp_directory'], s -> current_setting(s)) FROM t",
        "WITH x AS (SELECT current_setting('secret_directory') AS d) SELECT d FROM x, t",
    ],
)
def test_flight_sql_refuses_settings_and_introspection(sql_table: HarnessClient, sql: str) -> None:
    with flightsql.connect(sql_table.uri, autocommit=True) as conn, conn.cursor() as cur:
        with pytest.raises(adbc_driver_manager.ProgrammingError, match="is not allowed") as e:
            cur.execute(sql)
        assert "INVALID_ARGUMENT" in str(e.value) and ".tmp" not in str(e.value)
        cur.execute("SELECT version, count(*) AS n FROM t GROUP BY version ORDER BY version")
        assert cur.fetchall() == [("a", 1), ("b", 1)]  # a column named 'version' is fine


def test_flight_sql_refuses_a_denied_function_bound_in_a_prepared_statement(
    sql_table: HarnessClient,
) -> None:
    with (
        flightsql.connect(sql_table.uri, autocommit=True) as conn,
        conn.cursor() as cur,
        pytest.raises(adbc_driver_manager.ProgrammingError, match="is not allowed"),
    ):
        cur.execute("SELECT current_setting(?) FROM t", parameters=("temp_directory",))


def test_duckdb_itself_is_asked_which_functions_a_statement_calls() -> None:
    """The second check, on DuckDB's parse of the SQL it runs, stands without the first."""
    from flight_gateway.faces.flightsql import query

    sql = "SELECT ('temp_directory').current_setting() AS d FROM t"
    tree: Any = sqlglot.parse_one(sql, read="duckdb")  # not through query.parse
    rewritten = query.rewrite(tree, query.table_refs(tree), [0])
    with pytest.raises(InvalidArgument, match="current_setting\\(\\) is not allowed"):
        query.check_duckdb_functions(rewritten)


# ---------------------------------------------------------------- 6. Flight SQL handles expire


def test_statement_handles_expire_like_tickets() -> None:
    sealer = HandleSealer(b"k" * 32, ttl_s=10)
    sealed = sealer.seal({"sql": "SELECT 1", "who": "a"}, now=1000.0)
    assert sealer.open(sealed, now=1009.0) == {"sql": "SELECT 1", "who": "a"}
    with pytest.raises(InvalidArgument, match="statement handle has expired"):
        sealer.open(sealed, now=1011.0)


def test_expired_handles_are_refused_by_the_gateway(tmp_path: Path) -> None:
    ttl = 2.0
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", ticket_ttl_s=ttl) as (server, _):
        with client_for(server) as client:
            write_parquet(tmp_path / "t.parquet", pa.table({"id": [1, 2]}))
            client.create_table("t", [{"name": "id", "type": "int64"}])
            client.add_source(
                "t", "f", "files", config={"root": str(tmp_path)}, state={"files": ["t.parquet"]}
            )
        uri = f"grpc://127.0.0.1:{server.port}"
        raw = fl.connect(uri)
        command = pack(pb.CommandStatementQuery(query="SELECT count(*) FROM t"))
        info = raw.get_flight_info(fl.FlightDescriptor.for_command(command))
        assert raw.do_get(info.endpoints[0].ticket).read_all().column(0).to_pylist() == [2]
        with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_prepare("SELECT id FROM t WHERE id >= ? ORDER BY id")
            time.sleep(ttl + 0.5)
            with pytest.raises(pa.ArrowInvalid, match="statement handle has expired"):
                raw.do_get(info.endpoints[0].ticket).read_all()  # INVALID_ARGUMENT, as tickets
            with pytest.raises(adbc_driver_manager.ProgrammingError, match="has expired"):
                cur.execute("SELECT id FROM t WHERE id >= ? ORDER BY id", parameters=(2,))
            cur.execute("SELECT id FROM t WHERE id >= ? ORDER BY id ", parameters=(2,))
            assert cur.fetchall() == [(2,)]  # prepared afresh: served
        raw.close()
