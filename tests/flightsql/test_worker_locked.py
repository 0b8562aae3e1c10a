"""Statements over files alone reuse a database locked to their files: its sandbox was set by
the first statement (external access off but to those files, configuration locked) and cannot
change, so only a statement over exactly the same files gets it, on a connection of its own
whose relations go with it (a fresh database costs ~8 ms of a tiny statement's ~10)."""

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
    for _, db in made.locked.values():
        db.close()
    a.close()
    b.close()


def _count(path: str, **more: Any) -> dict[str, Any]:
    return {"op": "run", "sql": f"SELECT count(*) AS n FROM read_parquet('{path}')",
            "steps": [], "files": [path], "dsns": [], "batch_rows": 1024, **more}  # fmt: skip


def _statement(
    worker: w.Worker, request: dict[str, Any], interrupt_after_s: float | None = None
) -> tuple[dict[str, Any], Any]:
    """Run ``request`` as ``serve`` does for a quick statement: the answer, then ``keep``."""
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


def test_statements_over_the_same_files_share_a_locked_database(worker, files) -> None:
    for _ in range(3):
        answer, rows = _statement(worker, _count(files[0]))
        assert "error" not in answer and rows.column("n").to_pylist() == [10]
    assert len(worker.made) == 1
    assert list(worker.locked) == [(files[0],)]
    # Other files: a database of their own, locked to them.
    answer, rows = _statement(worker, _count(files[1]))
    assert rows.column("n").to_pylist() == [20] and len(worker.made) == 2


def test_a_locked_database_reads_no_other_file_and_its_configuration_stays_locked(
    worker, files
) -> None:
    _statement(worker, _count(files[0]))
    other = _count(files[1])
    other["files"] = [files[0]]  # its key finds the database locked to the first file
    answer, _ = _statement(worker, other)
    assert answer["error"] == "query" and len(worker.made) == 1
    setting = {**_count(files[0]), "sql": "SELECT 1", "steps": [{"sql": "SET threads = 4"}]}
    answer, _ = _statement(worker, setting)
    assert answer["error"] == "source" and "configuration" in answer["message"].lower()


def test_a_statements_relations_go_with_its_connection(worker, files) -> None:
    first = _count(files[0])
    first["steps"] = [{"sql": f"CREATE TEMP VIEW mine AS SELECT * FROM read_parquet('{files[0]}')"}]
    first["sql"] = "SELECT count(*) AS n FROM mine"
    assert _statement(worker, first)[1].column("n").to_pylist() == [10]
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
    # The sets of the latest statements only: the one used longest ago is closed.
    for path in files:
        _statement(worker, _count(path))
    assert list(worker.locked) == [(files[1],), (files[2],)]
    assert len(worker.locked) == w.LOCKED_KEYS


def test_only_statements_over_files_alone_are_kept_by_their_files() -> None:
    assert w.locked_key(_count("/d/b.parquet", files=["/d/b.parquet", "/d/a.parquet"])) == (
        "/d/a.parquet",
        "/d/b.parquet",
    )
    assert w.locked_key(_count("/d/a.parquet", dsns=["postgresql://h/db"])) is None
    typing = {"op": "schema", "sql": "SELECT 1", "steps": [], "files": [], "dsns": []}
    assert w.locked_key(typing) is None
