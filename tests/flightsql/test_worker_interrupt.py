"""A statement's interrupt asked for before its query starts (while its relations are made: a
statement started early and cancelled at once) still stops it. DuckDB's ``interrupt`` stops only
the query running at that moment, so the worker's watcher asks again until the statement ends."""

from __future__ import annotations

import os
import threading
import time

import duckdb

from flight_gateway.faces.flightsql import worker as protocol

ENDLESS = "SELECT sum(hash(range)) FROM range(1000000000000)"  # hours, unless interrupted


def _watched() -> tuple[duckdb.DuckDBPyConnection, int, threading.Event, threading.Thread]:
    """A connection under the worker's watcher: (it, the interrupt pipe's write end, the
    statement's finished event, the watcher)."""
    con = duckdb.connect()
    read_fd, write_fd = os.pipe()
    finished = threading.Event()
    watcher = threading.Thread(target=protocol._watch, args=(read_fd, con, finished), daemon=True)
    watcher.start()
    return con, write_fd, finished, watcher


def test_an_interrupt_asked_before_the_query_starts_still_stops_it() -> None:
    con, write_fd, finished, watcher = _watched()
    os.write(write_fd, b"x")  # the caller cancels ...
    os.close(write_fd)
    time.sleep(0.2)  # ... while the statement is still being set up
    outcome: list[BaseException] = []

    def query() -> None:
        try:
            con.execute(ENDLESS).fetchall()
        except BaseException as e:
            outcome.append(e)

    runner = threading.Thread(target=query, daemon=True)
    runner.start()
    runner.join(20)
    stuck = runner.is_alive()
    finished.set()
    if stuck:
        con.interrupt()
        runner.join(20)
    assert not stuck, "the interrupt asked for before the query started was lost"
    assert outcome and isinstance(outcome[0], duckdb.InterruptException)
    watcher.join(5)
    assert not watcher.is_alive()


def test_the_watcher_stops_once_the_statement_has_finished() -> None:
    con, write_fd, finished, watcher = _watched()
    assert con.execute("SELECT 42").fetchall() == [(42,)]
    finished.set()
    os.close(write_fd)  # the gateway closes the pipe after the answer
    watcher.join(5)
    assert not watcher.is_alive()
    assert con.execute("SELECT 1").fetchall() == [(1,)]  # no interrupt left behind
