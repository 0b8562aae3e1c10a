"""Caller SQL cannot take the gateway's memory (audit finding 1, Security III).

DuckDB evaluates constant expressions while it binds a statement, so typing one
(GetFlightInfo, GetSchema) ran ``repeat('x', 400000000)``; its ``memory_limit`` does not cover
such values while running either. Statements, and their typing, now run in worker processes
with a hard memory bound, holding a stream slot and a statement slot. Here 8 callers send such
statements at once, through typing and through execution, to a real gateway process, while
another caller reads: the gateway's resident memory stays bounded, the offending calls fail with
RESOURCE_EXHAUSTED, the other reads succeed.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import duckdb
import pyarrow.flight as fl
import pytest

from benchmarks.processes import GatewayProcess
from clients import HarnessClient
from flight_gateway.protocol.flightsql import pack, pb

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MEMORY_MB = 64
STATEMENTS = 2
# Folded while binding: typing alone evaluated it in the gateway (in a worker an allocation
# past the bound makes DuckDB leave the expression unfolded: typing succeeds, running fails).
CONSTANT = "SELECT length(repeat('x', 400000000)) + i AS n FROM t"
# Not constant: typing is cheap, running computes 400 MB per row.
PER_ROW = "SELECT length(repeat('x', 400000000 + i)) AS n FROM t"
# Grows a megabyte at a time to a gigabyte (1,000 rows of t x t x t).
GROWING = "SELECT length(string_agg(repeat('x', 1000000 + a.i), '')) AS n FROM t a, t b, t c"


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _rss_mb(pid: int) -> float:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * 4096 / 2**20
    except OSError:
        return 0.0


def _command(sql: str) -> fl.FlightDescriptor:
    return fl.FlightDescriptor.for_command(pack(pb.CommandStatementQuery(query=sql)))


@pytest.fixture
def gateway(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    duckdb.sql(f"COPY (SELECT range::BIGINT AS i FROM range(10)) TO '{data / 't.parquet'}'")
    gw = GatewayProcess(
        f"sqlite:///{tmp_path / 'c.db'}",
        tmp_path,
        limits={
            "sql_memory_limit_mb": MEMORY_MB,
            "max_concurrent_statements": STATEMENTS,
            "max_streams_per_principal": 64,
        },
        reach={"paths": [str(data)]},
    )
    gw.start()
    with HarnessClient(gw.uri) as client:
        client.create_table("t", [{"name": "i", "type": "int64"}])
        client.add_source("t", "f", "files", config={"root": str(data)},
                          state={"files": ["t.parquet"]})  # fmt: skip
    try:
        yield gw
    finally:
        gw.stop()


def test_statements_past_their_memory_fail_alone_and_the_gateway_stays_bounded(
    gateway: GatewayProcess,
) -> None:
    assert gateway.proc is not None
    pid = gateway.proc.pid
    peak = {"gateway": 0.0, "worker": 0.0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak["gateway"] = max(peak["gateway"], _rss_mb(pid))
            for child in _children(pid):
                peak["worker"] = max(peak["worker"], _rss_mb(child))
            time.sleep(0.005)

    outcomes: list[BaseException | None] = []

    def offend(i: int) -> None:
        """Types and runs one of the three; a caller refused as busy (the statement slots are all
        taken) tries again until its statement has run into its bound."""
        raw = fl.FlightClient(gateway.uri)
        deadline = time.monotonic() + 90
        try:
            while True:
                try:
                    info = raw.get_flight_info(_command((CONSTANT, PER_ROW, GROWING)[i % 3]))
                    raw.do_get(info.endpoints[0].ticket).read_all()
                    outcomes.append(None)
                    return
                except fl.FlightServerError as e:
                    if "in progress" not in str(e) or time.monotonic() > deadline:
                        outcomes.append(e)
                        return
                    time.sleep(0.05)
        finally:
            raw.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    offenders = [threading.Thread(target=offend, args=(i,)) for i in range(8)]
    for t in offenders:
        t.start()
    # Meanwhile another caller's reads succeed: a native read and a statement (the client
    # retries a statement refused as busy while the offenders hold the statement slots).
    with HarnessClient(gateway.uri) as other:
        for _ in range(3):
            assert other.read("t").num_rows == 10
        assert other.sql("SELECT sum(i) AS s FROM t").to_pylist() == [{"s": 45}]
    for t in offenders:
        t.join(120)
    done.set()
    sampler.join()
    assert len(outcomes) == 8
    for e in outcomes:
        assert isinstance(e, fl.FlightServerError), e
        assert "RESOURCE_EXHAUSTED" in str(e) and "limits.sql_memory_limit_mb" in str(e), e
    assert peak["gateway"] < STATEMENTS * MEMORY_MB + 300, peak
    # A worker holds its own start-up size (Python, DuckDB, pyarrow: ~95 MB) plus the bound:
    # DuckDB's limit and a quarter more, at least 64 MB.
    assert peak["worker"] < 110 + MEMORY_MB + 64, peak
    with HarnessClient(gateway.uri) as after:  # and the gateway still serves statements
        assert after.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 10}]
