"""Typing a statement in a statement worker: over empty views it runs on one database the worker
makes once (a fresh DuckDB database costs ~10 ms), each typing on a connection of its own. That
database reads nothing and keeps nothing of a typing: its views go with their connection, and
its configuration is locked."""

from __future__ import annotations

import base64
import os
import socket
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from flight_gateway.faces.flightsql import worker as w

LIMITS = {"memory_limit_mb": 256, "duckdb_memory_mb": 128, "threads": 1}


@pytest.fixture
def worker(tmp_path: Path):
    a, b = socket.socketpair()
    made = w.Worker(a, {**LIMITS, "spill_root": str(tmp_path), "spill_limit_mb": 64})
    yield made
    made.forget_typing()
    a.close()
    b.close()


def _typing(sql: str, views: dict[str, str], **more: Any) -> dict[str, Any]:
    steps = [{"sql": f"CREATE TEMP VIEW {name} AS {body}"} for name, body in views.items()]
    return {"op": "schema", "sql": sql, "steps": steps, "files": [], "dsns": [], **more}


def _run(worker: w.Worker, request: dict[str, Any]) -> dict[str, Any]:
    interrupt_r, interrupt_w = os.pipe()
    used: list[Any] = []
    try:
        return worker.run(request, [interrupt_r], used)
    finally:
        for con in used:
            con.close()
        os.close(interrupt_w)


def test_typings_share_one_database_and_none_sees_anothers_views(worker, monkeypatch) -> None:
    made: list[Any] = []
    new = worker._new
    monkeypatch.setattr(worker, "_new", lambda dsns: made.append(new(dsns)) or made[-1])
    first = _typing(
        "SELECT a + 1 AS b FROM __harness_0", {"__harness_0": "SELECT 1::INTEGER AS a WHERE false"}
    )
    assert "schema" in _run(worker, first)
    second = _typing(
        "SELECT x FROM __harness_1", {"__harness_1": "SELECT 'x'::VARCHAR AS x WHERE false"}
    )
    assert "schema" in _run(worker, second)
    assert len(made) == 1  # one database for both
    # The first typing's view went with its connection.
    leaked = _run(worker, _typing("SELECT a FROM __harness_0", {}))
    assert leaked["error"] == "query" and "__harness_0" in leaked["message"]


def test_the_typing_database_reads_no_file_and_its_configuration_is_locked(
    worker, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("s\nhidden\n")
    got = _run(worker, _typing(f"SELECT * FROM read_csv('{secret}')", {}))
    assert got["error"] == "query" and "hidden" not in got["message"]
    assert worker._typing is not None
    con = worker.typing_connection()
    try:
        with pytest.raises(Exception, match="configuration"):
            con.execute("SET enable_external_access = true")
    finally:
        con.close()


def test_a_typing_over_files_servers_or_streams_gets_a_database_of_its_own() -> None:
    assert w.typing_only(_typing("SELECT 1", {"v": "SELECT 1"}))
    assert not w.typing_only(_typing("SELECT 1", {}, files=["/data/a.parquet"]))
    assert not w.typing_only(_typing("SELECT 1", {}, dsns=["postgresql://h/db"]))
    streamed = _typing("SELECT 1", {})
    streamed["steps"].append({"stream": "__stream_0", "fd": 0, "materialize": False})
    assert not w.typing_only(streamed)
    assert not w.typing_only({**_typing("SELECT 1", {}), "op": "run"})


def test_each_database_spills_to_a_directory_of_its_own_gone_when_it_closes(
    tmp_path: Path,
) -> None:
    a, b = socket.socketpair()
    limits = {**LIMITS, "duckdb_memory_mb": 32, "spill_root": str(tmp_path), "spill_limit_mb": 512}
    worker = w.Worker(a, limits)
    try:
        first, second = worker._new(()), worker._new(())
        dirs = [
            c.execute("SELECT current_setting('temp_directory')").fetchone()[0]
            for c in (first, second)
        ]
        assert dirs[0] != dirs[1]
        for d in dirs:
            assert Path(d).parent == tmp_path
            assert Path(d).name.startswith(w.spill_prefix(os.getpid()))
        assert list(tmp_path.iterdir()) == []  # made on the first spill only
        first.execute("CREATE TEMP TABLE x AS SELECT range::VARCHAR AS s FROM range(3000000)")
        first.execute("SELECT count(*) FROM (SELECT s FROM x ORDER BY s DESC)").fetchall()
        assert [p.name for p in tmp_path.iterdir()] == [Path(dirs[0]).name]
        first.close()
        second.close()
        assert list(tmp_path.iterdir()) == []
    finally:
        a.close()
        b.close()


def test_a_typing_is_in_utc_like_the_statement_it_types(worker) -> None:
    got = _run(worker, _typing("SELECT now() AS t", {}))
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(got["schema"])))
    assert schema.field("t").type == pa.timestamp("us", tz="UTC")


def test_duckdb_is_asked_a_types_name_once_whatever_the_columns_around_it() -> None:
    """Each statement's relations hold other columns of the same tables: the gateway asks
    DuckDB's name for each Arrow field type once, with its metadata (an extension name)."""
    from flight_gateway.faces.flightsql import engine

    json_field = pa.field("j", pa.string(), metadata={"ARROW:extension:name": "arrow.json"})
    unique = pa.decimal128(9, 3)  # a type no other test names, so not cached before

    class Counting:
        def __init__(self, con: Any) -> None:
            self.con, self.asked = con, 0

        def execute(self, sql: str) -> Any:
            self.asked += 1
            return self.con.execute(sql)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.con, name)

    con = Counting(engine.metadata())
    try:
        wide = pa.schema([("a", pa.int64()), ("d", unique), ("s", pa.string()), json_field])
        assert engine.duckdb_types(con, wide) == ["BIGINT", "DECIMAL(9,3)", "VARCHAR", "JSON"]
        asked = con.asked
        narrow = pa.schema([("x", unique), json_field, ("y", pa.int64())])
        assert engine.duckdb_types(con, narrow) == ["DECIMAL(9,3)", "JSON", "BIGINT"]
        assert con.asked == asked  # nothing new to ask
    finally:
        con.con.close()


def test_spares_are_kept_for_the_latest_server_sets_each(tmp_path: Path, monkeypatch) -> None:
    """Statements over PostgreSQL sources and statements over files alone, in turns, each find
    a database made ahead for them (attaching a server costs ~80 ms); the sets used longest ago
    give their databases up."""
    a, b = socket.socketpair()
    worker = w.Worker(a, {**LIMITS, "spill_root": str(tmp_path), "spill_limit_mb": 64})

    class Database:
        closed = False

        def close(self) -> None:
            self.closed = True

    made: list[tuple[tuple[str, ...], Database]] = []
    monkeypatch.setattr(
        worker, "_new", lambda dsns: made.append((tuple(dsns), Database())) or made[-1][1]
    )
    try:
        worker._refill(())
        worker._refill(("pg-a",))
        assert [k for k, _ in made] == [(), (), ("pg-a",), ("pg-a",)]
        files_only = worker.connect(())  # the set used before the last still has its spares
        assert files_only in [db for k, db in made if k == ()]
        assert worker.connect(("pg-a",)) in [db for k, db in made if k == ("pg-a",)]
        assert len(made) == 4  # neither made on the statement's path
        worker._refill(("pg-b",))  # a third set: the one used longest ago gives its spare up
        left = [db for k, db in made if k == () and db is not files_only]
        assert len(left) == 1 and left[0].closed
        assert set(worker.spares) == {("pg-a",), ("pg-b",)}
    finally:
        a.close()
        b.close()


def test_the_databases_a_worker_keeps_leave_a_statement_its_whole_allowance(
    tmp_path: Path,
) -> None:
    """The memory bound of a worker process counts the databases it keeps between statements
    (spares, the typing database: ~10 MB each) as its own: a statement still has its whole
    allowance once they are made."""
    import time

    from flight_gateway.faces.flightsql.workers import Worker, WorkerLimits

    allowance_mb = 64
    limits = WorkerLimits(memory_limit_mb=allowance_mb, duckdb_memory_mb=32, threads=2,
                          spill_root=str(tmp_path), spill_limit_mb=64)  # fmt: skip
    proc = Worker(limits)
    try:
        sizes: list[int] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until its spares are made
            with open(f"/proc/{proc.pid}/status") as f:
                line = next(x for x in f if x.startswith("VmData:"))
            sizes.append(int(line.split()[1]) * 1024)
            if len(sizes) > 10 and sizes[-1] == sizes[-10]:
                break
            time.sleep(0.1)
        assert sizes[-1] > sizes[0]  # the spares were made after the bound was set
        assert proc.data_limit - sizes[-1] >= allowance_mb << 20
    finally:
        proc.kill()


def test_databases_made_at_once_spill_to_directories_of_their_own(tmp_path: Path) -> None:
    """A statement's thread makes a database when no spare is ready while the maker thread
    makes the next spare: each still gets a spill directory of its own (one closing removes
    its directory, and what another spilled there would go with it)."""
    import threading

    a, b = socket.socketpair()
    worker = w.Worker(a, {**LIMITS, "spill_root": str(tmp_path), "spill_limit_mb": 64})
    found: list[str] = []

    def make() -> None:
        for _ in range(25):
            con = worker._new(())
            found.append(con.execute("SELECT current_setting('temp_directory')").fetchone()[0])
            con.close()

    threads = [threading.Thread(target=make) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(found) == 100 and len(set(found)) == 100
    finally:
        a.close()
        b.close()
