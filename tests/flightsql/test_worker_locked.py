"""A caller's statements over files alone reuse a database locked to their files: its sandbox
was set when it was made (external access off but to those files, configuration locked) and
cannot change, so a statement gets it only when all of its files are among them, and only for
the same caller (its scope: the principal and its grants), on a connection of its own whose
relations go with it (a fresh database costs ~8 ms of CPU, a tiny statement's ~10 ms). A
statement over other files gets a database locked to its files and those of the one it
replaces, up to ``LOCKED_MAX_FILES``."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from flight_gateway.faces.flightsql import worker as w

LIMITS = {"memory_limit_mb": 256, "duckdb_memory_mb": 128, "threads": 1}


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    made = []
    for name, n in (("a", 10), ("b", 20), ("c", 30)):
        path = tmp_path / f"{name}.parquet"
        duckdb.connect().execute(f"COPY (SELECT range AS i FROM range({n})) TO '{path}'")
        made.append(str(path))
    return made


@pytest.fixture
def worker(tmp_path: Path, monkeypatch):
    a, b = socket.socketpair()
    made = w.Worker(a, {**LIMITS, "spill_root": str(tmp_path), "spill_limit_mb": 64})
    made.made = []  # type: ignore[attr-defined]
    new = made._new
    monkeypatch.setattr(made, "_new", lambda dsns: made.made.append(new(dsns)) or made.made[-1])
    yield made
    for held in made.locked.values():
        held.db.close()
    a.close()
    b.close()


def _count(path: str, **more: Any) -> dict[str, Any]:
    return {"op": "run", "sql": f"SELECT count(*) AS n FROM read_parquet('{path}')",
            "steps": [], "files": [path], "dsns": [], "batch_rows": 1024, "scope": "ann",
            **more}  # fmt: skip


def _statement(
    worker: w.Worker, request: dict[str, Any], interrupt_after_s: float | None = None
) -> tuple[dict[str, Any], Any]:
    """Run ``request`` as ``serve`` does: the answer, then ``keep``."""
    result_r, result_w = os.pipe()
    interrupt_r, interrupt_w = os.pipe()
    used: list[Any] = []
    if interrupt_after_s is not None:
        threading.Timer(interrupt_after_s, os.write, (interrupt_w, b"x")).start()
    try:
        answer = worker.run(request, [result_w, interrupt_r], used)
        with os.fdopen(result_r, "rb") as f:
            try:
                rows = pa.ipc.open_stream(f).read_all()
            except pa.ArrowInvalid:
                rows = None
        worker.keep(request, answer, used)
    finally:
        w._close_all(used)
        os.close(interrupt_w)
    return answer, rows


def _n(rows: Any) -> list[int]:
    return rows.column("n").to_pylist()


def test_a_callers_statements_share_a_database_locked_to_their_files(worker, files) -> None:
    for _ in range(3):
        answer, rows = _statement(worker, _count(files[0]))
        assert "error" not in answer and _n(rows) == [10]
    assert len(worker.made) == 1
    # Another file: a database locked to both, which replaces the first...
    assert _n(_statement(worker, _count(files[1]))[1]) == [20]
    assert len(worker.made) == 2 and worker.locked["ann"].allowed == {files[0], files[1]}
    # ... and serves statements over either, or both.
    assert _n(_statement(worker, _count(files[0]))[1]) == [10]
    both = {**_count(files[0]), "files": files[:2],
            "sql": f"SELECT count(*) AS n FROM read_parquet(['{files[0]}', '{files[1]}'])"}  # fmt: skip
    assert _n(_statement(worker, both)[1]) == [30]
    assert len(worker.made) == 2


def test_another_caller_never_gets_a_callers_database(worker, files) -> None:
    _statement(worker, _count(files[0]))
    _, rows = _statement(worker, _count(files[0], scope="bob"))
    assert _n(rows) == [10] and len(worker.made) == 2
    assert worker.locked["ann"].db is not worker.locked["bob"].db
    _statement(worker, _count(files[0], scope=""))  # no scope: a database for it alone
    assert len(worker.made) == 3 and set(worker.locked) == {"ann", "bob"}


def test_a_locked_database_reads_no_other_file_and_its_configuration_stays_locked(
    worker, files
) -> None:
    _statement(worker, _count(files[0]))
    other = {**_count(files[0]), "sql": f"SELECT count(*) AS n FROM read_parquet('{files[1]}')"}
    answer, _ = _statement(worker, other)  # its files are the first's: it gets that database
    # Refused, not counted (b.parquet holds 20 rows; the message names its path, whose
    # temporary directory may hold a "20" of its own).
    assert answer["error"] == "query" and "disabled by configuration" in answer["message"]
    assert "rows" not in answer
    assert len(worker.made) == 1
    setting = {**_count(files[0]), "sql": "SELECT 1", "steps": [{"sql": "SET threads = 4"}]}
    answer, _ = _statement(worker, setting)
    assert answer["error"] == "source" and "configuration" in answer["message"].lower()


def test_a_statements_relations_go_with_its_connection(worker, files) -> None:
    first = _count(files[0])
    first["steps"] = [{"sql": f"CREATE TEMP VIEW mine AS SELECT * FROM read_parquet('{files[0]}')"}]
    first["sql"] = "SELECT count(*) AS n FROM mine"
    assert _n(_statement(worker, first)[1]) == [10]
    answer, _ = _statement(worker, {**_count(files[0]), "sql": "SELECT count(*) FROM mine"})
    assert answer["error"] == "query" and "mine" in answer["message"]
    assert len(worker.made) == 1


def test_what_is_not_kept(worker, files) -> None:
    materialized = _count(files[0])
    materialized["steps"] = [{"sql": "SELECT 1", "materialize": True}]
    _statement(worker, materialized)
    long = {**_count(files[1]), "sql": "SELECT count(*) FROM range(1000000000000)"}
    assert _statement(worker, long, interrupt_after_s=0.2)[0]["error"] == "interrupted"
    assert worker.locked == {}
    # The callers of the latest statements only: the one seen longest ago loses its database.
    for scope in ("ann", "bob", "cy"):
        _statement(worker, _count(files[0], scope=scope))
    assert list(worker.locked) == ["bob", "cy"]
    assert len(worker.locked) == w.LOCKED_KEYS


def test_a_database_is_not_kept_while_the_worker_has_grown(worker, files, monkeypatch) -> None:
    """DuckDB holds what a large statement freed until its database closes: a worker grown
    past ``KEEP_GROWN_BYTES`` closes it (the gateway would replace a worker grown further)."""
    monkeypatch.setattr(w, "KEEP_GROWN_BYTES", -(1 << 40))
    assert _n(_statement(worker, _count(files[0]))[1]) == [10]
    assert worker.locked == {}
    monkeypatch.setattr(w, "KEEP_GROWN_BYTES", 1 << 40)
    _statement(worker, _count(files[0]))
    assert list(worker.locked) == ["ann"]


def test_a_locked_database_holds_up_to_so_many_files(worker, files, monkeypatch) -> None:
    monkeypatch.setattr(w, "LOCKED_MAX_FILES", 2)
    for path in files:
        _statement(worker, _count(path))
    assert worker.locked["ann"].allowed == {files[2]}
    assert len(worker.made) == 3


def test_only_a_callers_statements_over_files_alone_have_a_scope() -> None:
    assert w.locked_scope(_count("/d/a.parquet")) == "ann"
    assert w.locked_scope(_count("/d/a.parquet", dsns=["postgresql://h/db"])) is None
    assert w.locked_scope(_count("/d/a.parquet", scope="")) is None
    typing = {"op": "schema", "sql": "SELECT 1", "steps": [], "files": [], "dsns": []}
    assert w.locked_scope(typing) is None


def _served(peer: socket.socket, request: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """``request`` sent to a worker that ``serve``s on the other end of ``peer``."""
    result_r, result_w = os.pipe()
    interrupt_r, interrupt_w = os.pipe()
    try:
        w.send(peer, request, [result_w, interrupt_r])
        os.close(result_w)
        os.close(interrupt_r)
        with os.fdopen(result_r, "rb") as f:
            rows = pa.ipc.open_stream(f).read_all()
        answer, fds = w.receive(peer)
        assert answer is not None and not fds
        return answer, rows
    finally:
        os.close(interrupt_w)


def test_a_long_statements_database_is_kept_too_and_not_settled(tmp_path, files) -> None:
    """A statement over files that took a while keeps its database for its caller's next ones
    (the first query in a fresh database costs ~25 ms more), so the worker has nothing to close
    and says so: no "settling". One whose database is not kept (no caller scope) settles as
    before: its database is closed before the worker is lent again."""
    a, b = socket.socketpair()
    made = w.Worker(a, {**LIMITS, "spill_root": str(tmp_path), "spill_limit_mb": 64})
    server = threading.Thread(target=made.serve, daemon=True)
    server.start()
    try:
        slow = (f"SELECT n FROM (SELECT count(*) AS n FROM read_parquet('{files[2]}')), "
                "(SELECT sum(hash(range)) AS s FROM range(100000000)) WHERE s IS NOT NULL")  # fmt: skip
        answer, rows = _served(b, {**_count(files[2]), "sql": slow})
        assert "error" not in answer and _n(rows) == [30]
        assert "settling" not in answer and "ann" in made.locked
        answer, rows = _served(b, {**_count(files[2]), "sql": slow, "scope": ""})
        assert answer.get("settling") is True and _n(rows) == [30]
        settled, _ = w.receive(b)
        assert settled is not None and settled.get("settled") is True
    finally:
        w.send(b, {"op": "exit"})
        server.join(10)
        a.close()
        b.close()
