"""A statement's interrupt asked for before its query starts (while its relations are made: a
statement started early and cancelled at once) still stops it. DuckDB's ``interrupt`` stops only
the query running at that moment, so the worker's watcher asks again until the statement ends."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import duckdb

from flight_gateway.faces.flightsql import worker as protocol

ENDLESS = "SELECT sum(hash(range)) FROM range(1000000000000)"  # hours, unless interrupted


def _watched(
    watcher: protocol.Watcher | None = None,
) -> tuple[duckdb.DuckDBPyConnection, int, int, threading.Event, protocol.Watcher]:
    """A connection under the worker's watcher: (it, the interrupt pipe's write end, the
    pipe its statement closes when it has ended, the statement's finished event, the
    watcher)."""
    watcher = watcher or protocol.Watcher()
    con = duckdb.connect()
    read_fd, write_fd = os.pipe()
    ended_r, ended_w = os.pipe()
    finished = threading.Event()
    watcher.watch(protocol.Watched(read_fd, ended_r, con, finished))
    return con, write_fd, ended_w, finished, watcher


def _end(ended_w: int, finished: threading.Event) -> None:
    """What the worker's statement thread does when the statement has ended."""
    finished.set()
    os.close(ended_w)


def _run_endless(con: duckdb.DuckDBPyConnection) -> tuple[bool, list[BaseException]]:
    """Run ``ENDLESS`` for up to 20 s: (whether it still runs, how it ended)."""
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
    if stuck:
        con.interrupt()
        runner.join(20)
    return stuck, outcome


def test_an_interrupt_asked_before_the_query_starts_still_stops_it() -> None:
    con, write_fd, ended_w, finished, _ = _watched()
    os.write(write_fd, b"x")  # the caller cancels ...
    os.close(write_fd)
    time.sleep(0.2)  # ... while the statement is still being set up
    stuck, outcome = _run_endless(con)
    _end(ended_w, finished)
    assert not stuck, "the interrupt asked for before the query started was lost"
    assert outcome and isinstance(outcome[0], duckdb.InterruptException)


def test_the_watcher_lets_a_finished_statement_go_and_stops_the_next() -> None:
    """The gateway may close a statement's interrupt pipe only after the next statement has
    started (or write to it late): the next is still watched, and stopped when asked; the first
    one's connection is never interrupted."""
    first, first_w, first_ended, first_finished, watcher = _watched()
    assert first.execute("SELECT 42").fetchall() == [(42,)]
    _end(first_ended, first_finished)  # its pipe still open on the gateway's side
    second, second_w, second_ended, second_finished, _ = _watched(watcher)
    with contextlib.suppress(OSError):  # the first one's, late: its read end may be closed
        os.write(first_w, b"x")
    os.close(first_w)
    time.sleep(0.2)
    assert first.execute("SELECT 1").fetchall() == [(1,)]  # no interrupt left behind
    os.write(second_w, b"x")
    stuck, outcome = _run_endless(second)
    _end(second_ended, second_finished)
    os.close(second_w)
    assert not stuck, "the second statement's interrupt was lost behind the first"
    assert outcome and isinstance(outcome[0], duckdb.InterruptException)
    third, third_w, third_ended, third_finished, _ = _watched(watcher)
    assert third.execute("SELECT 7").fetchall() == [(7,)]  # the watcher still serves
    _end(third_ended, third_finished)
    os.close(third_w)
