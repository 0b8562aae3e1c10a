"""The third audit's findings (Security III), each reproduced here and refused or bounded.

Numbers are the audit's. Finding 1 (typing and running caller SQL outside every bound) is
``test_sql_memory.py``; the Iceberg REST findings are with the REST face's tests.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st

from flight_gateway.protocol.errors import InvalidArgument
from tests.gateway.helpers import client_for, running_gateway

# ---------------------------------------------------------------- 12. table functions, twice


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM t, range(10)",
        "SELECT (SELECT max(range) FROM range(3)) AS m FROM t",
        "SELECT * FROM t, generate_series(1, 3)",
        "SELECT * FROM t, glob('/etc/*')",
    ],
)
def test_duckdb_refuses_table_functions_without_the_first_check(sql: str) -> None:
    """sqlglot's check refuses table functions; DuckDB's own parse of what runs refuses them
    too, so a statement the first parse misreads still cannot call one."""
    from flight_gateway.faces.flightsql import query

    tree: Any = sqlglot.parse_one(sql, read="duckdb")  # not through query.table_refs
    rewritten = tree.sql("duckdb").replace(" t", " __harness_0", 1)
    with pytest.raises(InvalidArgument, match=r"table function \w+\(\) is not allowed"):
        query.check_duckdb_functions(rewritten)


# ---------------------------------------------------------------- 8. LIKE without backtracking


def _like_by_regex(pattern: str, value: str) -> bool:
    import re

    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, flags=re.S) is not None


@settings(max_examples=2000, deadline=None)
@given(
    st.text(alphabet="ab%_", min_size=1, max_size=8),  # "" means no filter
    st.text(alphabet="abc", max_size=10),
)
def test_like_agrees_with_the_regex_it_replaces(pattern: str, value: str) -> None:
    from flight_gateway.faces.flightsql.metadata import sql_like

    assert sql_like(pattern, value) == _like_by_regex(pattern, value)


@pytest.mark.timeout(30)
def test_a_pattern_of_many_percent_signs_is_answered_at_once(tmp_path: Path) -> None:
    """11 ``%`` took 1.8 s through GetTables, each further one 3.6x more: 40 would not finish."""
    from flight_gateway.protocol.flightsql import pack, pb

    pattern = "%a" * 40 + "%b"
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}") as (server, _):
        client = client_for(server)
        client.create_table("a" * 200, [{"name": "id", "type": "int64"}])
        raw = fl.FlightClient(client.uri)
        command = pb.CommandGetTables(table_name_filter_pattern=pattern)
        info = raw.get_flight_info(fl.FlightDescriptor.for_command(pack(command)))
        assert raw.do_get(info.endpoints[0].ticket).read_all().num_rows == 0
        too_long = pb.CommandGetTables(table_name_filter_pattern="%" * 2000)
        with pytest.raises(pa.ArrowInvalid, match="at most 1024 characters"):
            raw.get_flight_info(fl.FlightDescriptor.for_command(pack(too_long)))
        raw.close()
        client.close()


# ---------------------------------------------------------------- 15. names with a newline


@pytest.mark.parametrize("bad", ["logs\n", "ns.logs\n"])
def test_table_names_are_matched_whole(client: Any, bad: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid table name"):
        client.create_table(bad, [{"name": "id", "type": "int64"}])


def test_source_names_are_matched_whole(client: Any, tmp_path: Path) -> None:
    client.create_table("t", [{"name": "id", "type": "int64"}])
    with pytest.raises(InvalidArgument, match="invalid source name"):
        client.add_source("t", "s\n", "files", config={"root": str(tmp_path)}, state={"files": []})


# ---------------------------------------------------------------- 18. handles keep their expiry


def test_binding_parameters_does_not_renew_a_handle() -> None:
    from flight_gateway.faces.flightsql.handles import HandleSealer

    sealer = HandleSealer(b"k" * 32, ttl_s=10)
    sealed = sealer.seal({"sql": "SELECT 1", "who": "a"}, now=1000.0)
    rebound = sealer.seal({**sealer.open(sealed, now=1008.0, keep_expiry=True), "params": [1]})
    assert sealer.open(rebound, now=1009.0)["params"] == [1]
    with pytest.raises(InvalidArgument, match="statement handle has expired"):
        sealer.open(rebound, now=1011.0)


def test_a_prepared_statement_used_on_and_on_still_expires(tmp_path: Path) -> None:
    import adbc_driver_flightsql.dbapi as flightsql
    import adbc_driver_manager
    import pyarrow.parquet as pq

    ttl = 2.0
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", ticket_ttl_s=ttl) as (server, _):
        client = client_for(server)
        pq.write_table(pa.table({"id": [1, 2]}), tmp_path / "t.parquet")
        client.create_table("t", [{"name": "id", "type": "int64"}])
        client.add_source("t", "f", "files", config={"root": str(tmp_path)},
                          state={"files": ["t.parquet"]})  # fmt: skip
        with flightsql.connect(client.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_prepare("SELECT id FROM t WHERE id >= ? ORDER BY id")
            deadline = time.monotonic() + ttl + 1.5
            with pytest.raises(adbc_driver_manager.ProgrammingError, match="has expired"):
                while time.monotonic() < deadline:  # each execution binds parameters again
                    cur.execute("SELECT id FROM t WHERE id >= ? ORDER BY id", parameters=(1,))
                    assert cur.fetchall() == [(1,), (2,)]
                    time.sleep(0.2)
        client.close()


# ---------------------------------------------------------------- 14. no INTERNAL for bad input


def _no_internal(call: Any) -> BaseException | None:
    """Runs ``call``; returns what it raised, failing on INTERNAL/UNKNOWN (a caller's doing
    must get a status that says so)."""
    try:
        call()
    except (fl.FlightInternalError, fl.FlightServerError) as e:
        assert "INTERNAL" not in str(e) and "internal error" not in str(e), e
        return e
    except BaseException as e:
        assert not isinstance(e, fl.FlightInternalError), e
        return e
    return None


def test_odd_flight_sql_type_urls_are_refused_plainly(client: Any) -> None:
    from google.protobuf import any_pb2

    from flight_gateway.protocol.flightsql import pb

    raw = fl.FlightClient(client.uri)
    names = [*sorted(n for n in dir(pb) if not n.startswith("__")), "Nope", "a" * 5000]
    for name in names:
        wrapper = any_pb2.Any(type_url=f"type.googleapis.com/arrow.flight.protocol.sql.{name}",
                              value=b"\xff\xff")  # fmt: skip
        descriptor = fl.FlightDescriptor.for_command(wrapper.SerializeToString())
        _no_internal(lambda d=descriptor: raw.get_flight_info(d))
        _no_internal(lambda d=descriptor: raw.get_schema(d))
        _no_internal(lambda w=wrapper: raw.do_get(fl.Ticket(w.SerializeToString())).read_all())
    raw.close()


def test_a_prepared_handle_is_not_a_statement_ticket(client: Any, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from flight_gateway.protocol.flightsql import pack, pb, unpack

    pq.write_table(pa.table({"id": [1]}), tmp_path / "t.parquet")
    client.create_table("t", [{"name": "id", "type": "int64"}])
    client.add_source("t", "f", "files", config={"root": str(tmp_path)},
                      state={"files": ["t.parquet"]})  # fmt: skip
    raw = fl.FlightClient(client.uri)
    request = pb.ActionCreatePreparedStatementRequest(query="SELECT id FROM t")
    (result,) = raw.do_action(fl.Action("CreatePreparedStatement", pack(request)))
    handle = unpack(result.body.to_pybytes()).prepared_statement_handle
    ticket = fl.Ticket(pack(pb.TicketStatementQuery(statement_handle=handle)))
    with pytest.raises(pa.ArrowInvalid, match="not a statement ticket's handle"):
        raw.do_get(ticket).read_all()
    info = raw.get_flight_info(
        fl.FlightDescriptor.for_command(pack(pb.CommandStatementQuery(query="SELECT id FROM t")))
    )
    statement = unpack(info.endpoints[0].ticket.ticket).statement_handle
    as_prepared = pb.CommandPreparedStatementQuery(prepared_statement_handle=statement)
    with pytest.raises(pa.ArrowInvalid, match="not a prepared statement's handle"):
        raw.get_flight_info(fl.FlightDescriptor.for_command(pack(as_prepared)))
    raw.close()


# ---------------------------------------------------------------- 16. binary headers, tracing on


def test_a_binary_trace_header_does_not_fail_the_call(client: Any) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from flight_gateway.core import tracing

    tracing.configure(exporter=InMemorySpanExporter())
    try:
        options = fl.FlightCallOptions(
            headers=[(b"grpc-trace-bin", b"\xff\xfe\x00\x80"), (b"x-span-bin", b"\xff\xfe\x80")]
        )
        raw = fl.FlightClient(client.uri)
        assert list(raw.list_flights(options=options)) == []
        raw.close()
    finally:
        tracing.disable()


# ---------------------------------------------------------------- 13. literal DSN passwords


def test_a_literal_dsn_password_never_comes_back_in_an_error(client: Any, pg_dsn: str) -> None:
    """A DuckLake source whose metadata DSN carries its password literally: the attach error
    quotes the DSN, and the caller gets it without the password."""
    from urllib.parse import urlsplit

    u = urlsplit(pg_dsn)
    metadata = (f"postgres:dbname=no_such_lake_db host={u.hostname} port={u.port} "
                "user=postgres password=Literal-Pw-8431")  # fmt: skip
    client.create_table("lake", [{"name": "id", "type": "int64"}])
    seen: list[str] = []
    config = {"metadata": metadata, "data_path": "/tmp/x/", "table": "t"}
    for step in (
        lambda: client.add_source("lake", "l", "ducklake", state={"snapshot_id": 1}, config=config),
        lambda: client.read("lake"),
    ):
        try:
            step()
        except Exception as e:
            seen.append(str(e))
    assert seen, "the attach should have failed"
    assert all("Literal-Pw-8431" not in text for text in seen), seen


# ---------------------------------------------------------------- 11. identities, not names


def _files_table(client: Any, root: Path, name: str, values: list[int]) -> None:
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": values}), root / "f.parquet")
    client.create_table(name, [{"name": "id", "type": "int64"}])
    client.add_source(name, "f", "files", config={"root": str(root)},
                      state={"files": ["f.parquet"]})  # fmt: skip


def test_a_dropped_and_created_table_is_never_served_from_the_first(
    client: Any, tmp_path: Path
) -> None:
    from flight_gateway.protocol.errors import NotFound

    _files_table(client, tmp_path / "a", "t", [1, 2, 3])
    assert client.read("t").column("id").to_pylist() == [1, 2, 3]  # cached at version 1
    old = client.flight_info("t").endpoints
    client.drop_table("t")
    _files_table(client, tmp_path / "b", "t", [7])  # the same name and version numbers
    assert client.read("t").column("id").to_pylist() == [7]
    assert client.read("t", version=1).column("id").to_pylist() == [7]
    with pytest.raises(NotFound, match="dropped"):
        client.read_endpoint(old[0]).read_all()


def test_an_expired_version_is_not_served_from_the_cache(client: Any, tmp_path: Path) -> None:
    from flight_gateway.protocol.errors import NotFound

    _files_table(client, tmp_path / "a", "t", [1])
    for i in range(3):
        client.commit("t", properties={"n": str(i)})
    assert client.read("t", version=1).num_rows == 1  # cached
    client.expire_versions("t", keep_last=1)
    with pytest.raises(NotFound, match="expired"):
        client.read("t", version=1)


def test_table_ids_are_never_reused_after_an_upgrade(tmp_path: Path) -> None:
    """A catalog made before ids were counted (schema version 2) starts counting past its
    largest id: the table dropped last does not lend its id to the next one."""
    from sqlalchemy import text

    from flight_gateway.catalog import Catalog

    url = f"sqlite:///{tmp_path / 'c.db'}"
    with Catalog(url) as cat:
        cat.create_table("a", [{"name": "id", "type": "int64"}])
        cat.create_table("b", [{"name": "id", "type": "int64"}])
        with cat.engine.begin() as conn:  # as a release before this one left it
            conn.execute(text("DROP TABLE harness_last_ids"))
            conn.execute(text("UPDATE harness_catalog_info SET schema_version = 2"))
    with Catalog(url) as cat:  # migrates to 3
        for _ in range(2):
            dropped = cat.describe("b").table_id  # the largest id
            cat.drop_table("b")
            cat.create_table("b", [{"name": "id", "type": "int64"}])
            assert cat.describe("b").table_id > dropped


# ---------------------------------------------------------------- 10. an empty token is none


def _rest_get(port: int, path: str, authorization: str | None) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_an_empty_token_is_refused_at_start_up(tmp_path: Path) -> None:
    from flight_gateway.core.config import GatewayConfig

    with pytest.raises(ValueError, match="an empty token"):
        GatewayConfig(tokens={"": {"name": "x", "read": ["*"]}}).token_store  # noqa: B018


def test_rest_takes_bearer_none_and_empty_as_no_token(tmp_path: Path) -> None:
    """pyiceberg without a token sends ``Bearer None``; ``Bearer `` is no token either: both
    are anonymous where anonymous reads are allowed, and refused where they are not."""
    tokens = {"reader-token-0123456789": {"name": "reader", "read": ["*"]}}
    for anonymous, expected in ((True, 200), (False, 401)):
        with running_gateway(f"sqlite:///{tmp_path / f'{anonymous}.db'}", tokens=tokens,
                             allow_anonymous=anonymous, iceberg_rest_port=0) as (server, _):  # fmt: skip
            port = server.rest.port
            for header in ("Bearer None", "Bearer ", None):
                assert _rest_get(port, "/v1/namespaces", header) == expected, header
            assert _rest_get(port, "/v1/namespaces", "Bearer reader-token-0123456789") == 200
            assert _rest_get(port, "/v1/namespaces", "Bearer wrong-token") == 401


# ---------------------------------------------------------------- 17. reach per table


def test_reach_scoped_to_tables(tmp_path: Path) -> None:
    """Storage granted to ``sales.*`` tables is out of reach of another table's admin; what
    the gateway-wide lists allow stays allowed to every table."""
    from flight_gateway.protocol.errors import Unauthorized

    sales, shared = tmp_path / "sales", tmp_path / "shared"
    reach = {"paths": [str(shared)], "tables": {"sales.*": {"paths": [str(sales)]}}}
    tokens = {"admin-token-0123456789": {"name": "admin", "admin": ["*"]}}
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", tokens=tokens, reach=reach,
                         allow_anonymous=False) as (server, _):  # fmt: skip
        client = client_for(server, token="admin-token-0123456789")
        _files_table(client, sales, "sales.orders", [1])
        _files_table(client, shared, "hr.people", [2])
        assert client.read("sales.orders").num_rows == 1
        client.create_table("hr.payroll", [{"name": "id", "type": "int64"}])
        with pytest.raises(Unauthorized, match="does not allow"):
            client.add_source("hr.payroll", "f", "files", config={"root": str(sales)},
                              state={"files": ["f.parquet"]})  # fmt: skip
        client.close()


# ---------------------------------------------------------------- 2. REST: identities, not names


def test_rest_never_serves_a_dropped_tables_rows(tmp_path: Path) -> None:
    from pyiceberg.catalog.rest import RestCatalog

    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", iceberg_rest_port=0) as (server, _):
        client = client_for(server)
        _files_table(client, tmp_path / "a", "t", [1, 2, 3])
        rest = RestCatalog("harness", uri=f"http://127.0.0.1:{server.rest.port}")
        assert sorted(rest.load_table("harness.t").scan().to_arrow().column("id").to_pylist()) == [
            1,
            2,
            3,
        ]
        client.drop_table("t")
        _files_table(client, tmp_path / "b", "t", [7])  # same name, same version numbers
        assert rest.load_table("harness.t").scan().to_arrow().column("id").to_pylist() == [7]
        client.close()
