"""Bad input found by probing the Flight face (2026-12-05): each case failed before its fix
(a cut upload committed, INTERNAL for a caller's mistake, a typo silently ignored, a wrong
answer), and each now gets the right status and commits nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import duckdb
import psycopg
import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import InvalidArgument, NotFound
from flight_gateway.protocol.flight_errors import from_flight_error

pytestmark = pytest.mark.integration


@pytest.fixture
def table(client: HarnessClient, tmp_path: Path) -> Path:
    """Table ``t`` (100 rows of ``i``, ``x``) in one files source ``f``; returns its root."""
    root = tmp_path / "data"
    root.mkdir()
    data = pa.table({"i": pa.array(range(100), pa.int64()), "x": [n / 3 for n in range(100)]})
    pq.write_table(data, root / "a.parquet")
    client.create_table("t", [{"name": "i", "type": "int64"}, {"name": "x", "type": "double"}])
    client.add_source("t", "f", "files", config={"root": str(root)}, state={"files": ["a.parquet"]})
    return root


def _raw(client: HarnessClient) -> fl.FlightClient:
    return fl.FlightClient(client.uri)


def _action(raw: fl.FlightClient, name: str, body: str | bytes) -> list[bytes]:
    data = body.encode() if isinstance(body, str) else body
    return [r.body.to_pybytes() for r in raw.do_action(fl.Action(name, data))]


def _typed(fn) -> Exception:  # type: ignore[no-untyped-def]
    """The typed harness error ``fn`` raised through raw pyarrow.flight."""
    with pytest.raises(Exception) as info:
        fn()
    return from_flight_error(info.value)


def _put(raw: fl.FlightClient, command: dict, data: pa.Table) -> bytes:
    writer, reply = raw.do_put(fl.FlightDescriptor.for_command(json.dumps(command)), data.schema)
    writer.write_table(data)
    writer.done_writing()
    buf = reply.read()
    writer.close()
    return buf.to_pybytes() if buf is not None else b""


def test_an_upload_cut_midway_commits_nothing(client: HarnessClient, table: Path) -> None:
    """A client gone after 3,000 of its 5,000 rows (no end of stream): pyarrow's reader ends
    such a stream as if it were whole; the gateway checks the call was not cut."""
    before = client.describe("t").version
    child = textwrap.dedent(f"""
        import json, os, time
        import pyarrow as pa, pyarrow.flight as fl
        c = fl.FlightClient({client.uri!r})
        t = pa.table({{"i": pa.array(range(5000), pa.int64())}})
        d = fl.FlightDescriptor.for_command(json.dumps({{"table": "t", "commit_id": "cut-1"}}))
        w, r = c.do_put(d, t.schema)
        for b in t.to_batches(max_chunksize=1000)[:3]:
            w.write_batch(b)
        time.sleep(0.3)
        os._exit(1)
    """)
    subprocess.run([sys.executable, "-c", child], check=False, timeout=60)
    time.sleep(1.0)  # the gateway's handler ends after the child's connection closed
    assert client.describe("t").version == before
    assert client.read("t").num_rows == 100
    out = client.put("t", pa.table({"i": pa.array([7], pa.int64())}), commit_id="cut-1")
    assert out["applied"] is True  # the commit id was never used: the retry applies


def test_an_upload_past_its_deadline_commits_nothing(client: HarnessClient, table: Path) -> None:
    raw = _raw(client)
    before = client.describe("t").version
    data = pa.table({"i": pa.array(range(1000), pa.int64())})
    command = {"table": "t", "commit_id": "late-1"}
    options = fl.FlightCallOptions(timeout=0.5)
    writer, _ = raw.do_put(
        fl.FlightDescriptor.for_command(json.dumps(command)), data.schema, options
    )
    writer.write_table(data)
    time.sleep(1.0)  # past the deadline, before the end of the stream
    with pytest.raises((fl.FlightError, pa.ArrowException)):
        writer.done_writing()
        writer.close()
    time.sleep(0.5)
    assert client.describe("t").version == before
    assert client.read("t").num_rows == 100


@pytest.mark.parametrize(
    "command, data, message",
    [
        ({"commit_id": "x" * 300}, None, "at most 256"),
        ({}, pa.table({"i": pa.array([], pa.int64())}), "no rows"),
        ({"mdoe": "merge"}, None, "unknown field"),
        ({}, pa.table([pa.array([1], pa.int64())] * 2, names=["i", "i"]), "more than once"),
    ],
)
def test_bad_uploads_write_no_file_and_no_version(
    client: HarnessClient, table: Path, command: dict, data: pa.Table | None, message: str
) -> None:
    raw = _raw(client)
    files = sorted(p.name for p in table.iterdir())
    before = client.describe("t").version
    full = {"table": "t", "commit_id": uuid.uuid4().hex, **command}
    rows = data if data is not None else pa.table({"i": pa.array([1], pa.int64())})
    error = _typed(lambda: _put(raw, full, rows))
    assert isinstance(error, InvalidArgument) and message in str(error)
    assert client.describe("t").version == before
    assert sorted(p.name for p in table.iterdir()) == files


def test_a_lone_surrogate_is_invalid_and_listing_still_works(
    client: HarnessClient, table: Path
) -> None:
    raw = _raw(client)
    body = '{"table": "u", "schema": [{"name": "\\ud800", "type": "int64"}]}'
    error = _typed(lambda: _action(raw, "harness.create_table", body))
    assert isinstance(error, InvalidArgument) and "surrogate" in str(error)
    read = '{"table": "t", "filter": "x = \'\\udc00\'"}'
    error = _typed(lambda: raw.get_flight_info(fl.FlightDescriptor.for_command(read)))
    assert isinstance(error, InvalidArgument)
    assert [f.descriptor.path for f in raw.list_flights()] == [[b"t"]]
    # a pair of escapes is one character, and a fine name
    pair = '{"table": "u", "schema": [{"name": "\\ud83d\\ude00", "type": "int64"}]}'
    _action(raw, "harness.create_table", pair)
    assert client.describe("u").schema[0].name == "\U0001f600"


@pytest.mark.parametrize(
    "call",
    [
        lambda raw: raw.get_flight_info(
            fl.FlightDescriptor.for_command(json.dumps({"table": "t", "version": 2**63}))
        ),
        lambda raw: raw.get_flight_info(
            fl.FlightDescriptor.for_command(json.dumps({"table": "t", "as_of": 10**400}))
        ),
        lambda raw: _action(raw, "harness.history", json.dumps({"table": "t", "limit": 2**63})),
        lambda raw: _action(
            raw, "harness.lock", json.dumps({"table": "t", "sources": ["f"], "ttl_s": 10**400})
        ),
        lambda raw: _action(
            raw, "harness.lock", json.dumps({"table": "t", "sources": [["f"]], "ttl_s": 5})
        ),
        lambda raw: _action(
            raw,
            "harness.move",
            json.dumps({"table": "t", "hot": "f", "cold": "f", "wait_s": 10**400}),
        ),
    ],
)
def test_numbers_out_of_range_and_odd_lists_are_invalid(
    client: HarnessClient, table: Path, call
) -> None:  # type: ignore[no-untyped-def]
    error = _typed(lambda: call(_raw(client)))
    assert isinstance(error, InvalidArgument), error
    assert len(str(error)) < 2100


def test_a_version_past_int64_in_sql_is_invalid(client: HarnessClient, table: Path) -> None:
    import adbc_driver_flightsql.dbapi as flightsql

    with (
        flightsql.connect(client.uri, autocommit=True) as conn,
        conn.cursor() as cur,
        pytest.raises(Exception, match=r"INVALID_ARGUMENT.*2\*\*63"),
    ):
        cur.execute("SELECT count(*) FROM t FOR VERSION AS OF 99999999999999999999")


def test_commit_write_of_a_file_never_written_commits_nothing(
    client: HarnessClient, table: Path
) -> None:
    raw = _raw(client)
    begun = json.loads(_action(raw, "harness.begin_write", json.dumps({"table": "t"}))[0])
    before = client.describe("t").version
    body = {"table": "t", "write_id": begun["write_id"],
            "paths": [begun["location"].rstrip("/") + "/typo.parquet"]}  # fmt: skip
    error = _typed(lambda: _action(raw, "harness.commit_write", json.dumps(body)))
    assert isinstance(error, InvalidArgument) and "do not exist" in str(error)
    assert client.describe("t").version == before
    assert client.read("t").num_rows == 100


@pytest.mark.parametrize(
    "field, message",
    [
        ({"name": "a", "type": "int64", "nulable": False}, "unknown key"),
        ({"name": "a", "type": "int64", "nullable": "no"}, "true or false"),
        ({"name": "a", "type": "timestamp[us, tz=Nowhere/Land]"}, "unknown time zone"),
        ({"name": "a\x00b", "type": "int64"}, "control characters"),
    ],
)
def test_a_schema_field_with_a_typo_or_a_bad_type_is_invalid(
    client: HarnessClient, field: dict, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        client.create_table("bad", [field])
    assert "bad" not in client.list_tables()


def test_a_misspelt_update_key_is_invalid(client: HarnessClient, table: Path) -> None:
    before = client.describe("t").version
    update = {"source": "f", "state": {"files": ["a.parquet"]}, "expect_state_verison": 99}
    with pytest.raises(InvalidArgument, match="unknown key"):
        client.commit("t", updates=[update])
    assert client.describe("t").version == before


@pytest.mark.parametrize("name", ["x" * 20_000, "表" * 800, "\U0001f600" * 20_000])
def test_a_long_name_keeps_its_status(client: HarnessClient, table: Path, name: str) -> None:
    """A message repeating a long name outgrew gRPC's trailer limit (percent-encoded: a
    non-ASCII byte takes three): the client saw RESOURCE_EXHAUSTED instead of NOT_FOUND."""
    with pytest.raises(NotFound, match="characters in all"):
        client.read(name)


def test_a_long_unknown_action_keeps_its_status(client: HarnessClient) -> None:
    with pytest.raises(pa.ArrowNotImplementedError, match="unknown action"):
        _action(_raw(client), "x" * 20_000, b"{}")


def test_an_upload_closed_early_by_its_client_commits_nothing(
    client: HarnessClient, table: Path
) -> None:
    """A client whose own code failed while writing closes its stream normally (no cut the
    gateway could see): the row count its descriptor declares tells (the Python client
    always sends it)."""
    raw = _raw(client)
    before = client.describe("t").version
    data = pa.table({"i": pa.array(range(5000), pa.int64())})
    command = {"table": "t", "commit_id": "early-1", "rows": data.num_rows}
    writer, _ = raw.do_put(fl.FlightDescriptor.for_command(json.dumps(command)), data.schema)
    for batch in data.to_batches(max_chunksize=1000)[:3]:
        writer.write_batch(batch)
    with pytest.raises(pa.ArrowInvalid, match="declares 5000"):
        writer.close()  # no done_writing: the stream ends as if whole
    assert client.describe("t").version == before
    out = client.put("t", data, commit_id="early-1")
    assert out["applied"] is True and client.read("t").num_rows == 5100


def test_a_schema_copied_from_describe_creates_a_table(client: HarnessClient, table: Path) -> None:
    """``describe``'s fields carry ``id`` and, after a rename, ``aliases``: both are taken and
    ignored by ``create_table``."""
    client.evolve_schema("t", [{"op": "rename_column", "name": "x", "new_name": "y"}])
    raw = _raw(client)
    fields = json.loads(_action(raw, "harness.describe", json.dumps({"table": "t"}))[0])["schema"]
    assert any("aliases" in f for f in fields)
    _action(raw, "harness.create_table", json.dumps({"table": "t2", "schema": fields}))
    assert [f.name for f in client.describe("t2").schema] == ["i", "y"]


def test_commit_write_refuses_a_query_string_in_a_path(client: HarnessClient, table: Path) -> None:
    """A path with a query string could point a file system at any endpoint before the
    source's allow-lists ran; no such path is ever a file the write made."""
    raw = _raw(client)
    begun = json.loads(_action(raw, "harness.begin_write", json.dumps({"table": "t"}))[0])
    path = begun["location"].rstrip("/") + "/x.parquet?endpoint_override=127.0.0.1:9"
    body = {"table": "t", "write_id": begun["write_id"], "paths": [path]}
    error = _typed(lambda: _action(raw, "harness.commit_write", json.dumps(body)))
    assert isinstance(error, InvalidArgument) and "not in this write's location" in str(error)


def test_an_unknown_action_is_unimplemented_whatever_its_body(client: HarnessClient) -> None:
    raw = _raw(client)
    for body in (b"\x08\x01\x12\x00", b"{}"):
        with pytest.raises(pa.ArrowNotImplementedError, match="unknown action"):
            _action(raw, "BeginTransaction", body)


def test_infinite_and_nan_parameters_bind_as_duckdb_reads_them(
    client: HarnessClient, tmp_path: Path
) -> None:
    """``inf`` was bound as a column name and NaN as NULL; the answers are DuckDB's on the
    same file (a column named ``inf`` shows the parameter is no column)."""
    import adbc_driver_flightsql.dbapi as flightsql

    root = tmp_path / "w"
    root.mkdir()
    path = root / "w.parquet"
    pq.write_table(pa.table({"x": [1.0, float("nan"), 5.0, float("-inf")],
                             "inf": [0.0] * 4}), path)  # fmt: skip
    client.create_table("w", [{"name": "x", "type": "double"}, {"name": "inf", "type": "double"}])
    client.add_source("w", "f", "files", config={"root": str(root)}, state={"files": [path.name]})
    oracle = duckdb.connect()
    cases = [
        ("x < ?", float("inf"), "'inf'::DOUBLE"),
        ("x > ?", float("-inf"), "'-inf'::DOUBLE"),
        ("x = ?", float("nan"), "'nan'::DOUBLE"),
        ("? IS NULL", float("nan"), "'nan'::DOUBLE"),
    ]
    with flightsql.connect(client.uri, autocommit=True) as conn, conn.cursor() as cur:
        for where, value, as_sql in cases:
            cur.execute(f"SELECT count(*) FROM w WHERE {where}", (value,))
            got = cur.fetchall()
            expected = oracle.execute(
                f"SELECT count(*) FROM '{path}' WHERE {where.replace('?', as_sql)}"
            ).fetchall()
            assert got == expected, (where, value)


def test_an_upload_into_a_missing_postgres_table_is_not_found(
    client: HarnessClient, pg_dsn: str
) -> None:
    name = f"missing_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        as_of = conn.execute("SELECT now()").fetchone()[0].isoformat()
    client.create_table("pg", [{"name": "id", "type": "int64"}])
    client.add_source("pg", "p", "postgres", config={"dsn": pg_dsn, "table": name},
                      state={"as_of": as_of})  # fmt: skip
    before = client.describe("pg").version
    with pytest.raises(NotFound, match="does not exist"):
        client.put("pg", pa.table({"id": pa.array([1], pa.int64())}), commit_id="d")
    assert client.describe("pg").version == before


@pytest.mark.parametrize(
    "change, message",
    [
        ({"op": "drop_column", "feild_id": 1, "name": "x"}, "unknown key"),
        ({"op": "drop_column", "field_id": "1"}, "field_id must be an integer"),
        ({"op": "add_column", "name": "z", "type": "int64", "doc": "?"}, "unknown key"),
    ],
)
def test_a_schema_change_with_a_typo_is_invalid(
    client: HarnessClient, table: Path, change: dict, message: str
) -> None:
    before = client.describe("t")
    with pytest.raises(InvalidArgument, match=message):
        client.evolve_schema("t", [change])
    assert client.describe("t") == before


def test_the_locks_of_a_missing_table_are_not_found(client: HarnessClient) -> None:
    with pytest.raises(NotFound):
        client.action("harness.list_locks", {"table": "nope"})


def test_a_transaction_id_is_refused_not_ignored(client: HarnessClient, table: Path) -> None:
    """The server runs no transactions (BeginTransaction is UNIMPLEMENTED, SqlInfo advertises
    none): a statement naming one was run outside any, as if the client's transaction held
    it. Now it is UNIMPLEMENTED, as BeginTransaction is, on every call that carries one."""
    from flight_gateway.protocol.flightsql import pack, pb

    raw = _raw(client)
    before = client.describe("t").version
    txn = b"made-up-transaction"
    query = pack(pb.CommandStatementQuery(query="SELECT count(*) FROM t", transaction_id=txn))
    for call in (raw.get_flight_info, raw.get_schema):
        with pytest.raises(pa.ArrowNotImplementedError, match="transaction"):
            call(fl.FlightDescriptor.for_command(query))
    prepare = pack(
        pb.ActionCreatePreparedStatementRequest(query="SELECT count(*) FROM t", transaction_id=txn)
    )
    with pytest.raises(pa.ArrowNotImplementedError, match="transaction"):
        _action(raw, "CreatePreparedStatement", prepare)
    update = pack(pb.CommandStatementUpdate(query="DELETE FROM t", transaction_id=txn))
    with pytest.raises(pa.ArrowNotImplementedError, match="transaction"):
        writer, _ = raw.do_put(fl.FlightDescriptor.for_command(update), pa.schema([]))
        writer.close()
    # An empty id is no transaction: the statement runs.
    plain = pack(pb.CommandStatementQuery(query="SELECT count(*) AS n FROM t", transaction_id=b""))
    info = raw.get_flight_info(fl.FlightDescriptor.for_command(plain))
    assert raw.do_get(info.endpoints[0].ticket).read_all().column("n").to_pylist() == [100]
    assert client.describe("t").version == before


def _unblock(fifo: Path) -> None:
    """End a read blocked opening ``fifo`` (before the fix, the gateway's read hung there):
    a writer that opens and closes it gives the reader end of file."""
    import contextlib
    import os

    with contextlib.suppress(OSError):  # nothing reading it
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.parametrize("special", ["fifo", "directory"])
def test_a_state_naming_a_fifo_or_a_directory_is_refused_at_commit(
    client: HarnessClient, table: Path, special: str
) -> None:
    """A named pipe or a directory in a files source's state (added, or committed as an
    update) or in commit_write's paths is INVALID_ARGUMENT; nothing is committed."""
    import os

    bad = table / "pipe.parquet"
    os.mkfifo(bad) if special == "fifo" else bad.mkdir()
    before = client.describe("t").version
    error = _typed(lambda: client.commit("t", updates=[{"source": "f",
                   "state": {"files": ["a.parquet", bad.name]}}]))  # fmt: skip
    assert isinstance(error, InvalidArgument) and "not a regular file" in str(error), error
    error = _typed(lambda: client.add_source(
        "t", "g", "files", config={"root": str(table)}, state={"files": [bad.name]}
    ))  # fmt: skip
    assert isinstance(error, InvalidArgument) and "not a regular file" in str(error), error
    raw = _raw(client)
    begun = json.loads(_action(raw, "harness.begin_write", json.dumps({"table": "t"}))[0])
    staged = Path(begun["location"].removeprefix("file://"))
    staged.mkdir(parents=True, exist_ok=True)
    os.mkfifo(staged / "w.parquet") if special == "fifo" else (staged / "w.parquet").mkdir()
    body = {"table": "t", "write_id": begun["write_id"], "paths": [f"{staged}/w.parquet"]}
    error = _typed(lambda: _action(raw, "harness.commit_write", json.dumps(body)))
    assert isinstance(error, InvalidArgument) and "not a regular file" in str(error), error
    assert client.describe("t").version == before
    assert client.read("t").num_rows == 100


def test_a_file_replaced_by_a_fifo_after_commit_is_unavailable_not_a_hang(
    client: HarnessClient, table: Path
) -> None:
    """The committed file replaced by a named pipe: planning the read was INTERNAL (a size
    of None), a Flight SQL statement over the table's relation planned before hung in
    DuckDB's open of the pipe; now each is UNAVAILABLE naming the file, at once, and the pipe
    is never opened."""
    import os
    import threading

    from flight_gateway.protocol.errors import Unavailable

    raw = _raw(client)
    info = raw.get_flight_info(fl.FlightDescriptor.for_path("t"))  # planned while it was a file
    assert client.sql("SELECT count(*) AS n FROM t").column("n").to_pylist() == [100]
    (table / "a.parquet").unlink()
    os.mkfifo(table / "a.parquet")
    options = fl.FlightCallOptions(timeout=20)
    rescue = threading.Timer(20, _unblock, [table / "a.parquet"])  # a hang ends, and fails
    rescue.start()
    try:
        started = time.monotonic()
        error = _typed(lambda: raw.do_get(info.endpoints[0].ticket, options).read_all())
        assert isinstance(error, Unavailable) and "not a regular file" in str(error), error
        error = _typed(lambda: raw.get_flight_info(fl.FlightDescriptor.for_path("t"), options))
        assert isinstance(error, Unavailable) and "not a regular file" in str(error), error
        error = _typed(lambda: client.sql("SELECT sum(i) AS s FROM t"))
        assert isinstance(error, Unavailable) and "not a regular file" in str(error), error
        assert time.monotonic() - started < 15
    finally:
        rescue.cancel()
        _unblock(table / "a.parquet")
