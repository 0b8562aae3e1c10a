"""Statements started at GetFlightInfo (``faces.flightsql.early``): the DoGet of the ticket takes
the running statement over; one no DoGet takes is stopped after ``limits.sql_early_start_s``,
when its statement is cancelled, when its caller asks for another FlightInfo, or when another
statement needs its slots; its slots and worker come back each time, and a DoGet of its ticket
later still runs it (from scratch)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tests.flightsql.test_cancel import LONG, _cancel_flight_info, _info, _running, _wait
from tests.flightsql.test_sql_engine import _numbers
from tests.gateway.helpers import client_for, running_gateway

pytestmark = pytest.mark.integration
COUNT = "SELECT count(*) AS n FROM numbers"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Any]:
    # One statement gateway-wide: a statement started early holds the only slot. No kept
    # results: a statement answered from one is not started.
    limits = {"sql_timeout_s": 120.0, "max_concurrent_statements": 1,
              "sql_early_start_s": 30.0, "sql_result_cache_mb": 0}  # fmt: skip
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", limits=limits) as (server, _):
        client = client_for(server)
        _numbers(client, tmp_path / "data", 1000)
        yield server
        client.close()


def _raw(server: Any) -> fl.FlightClient:
    return fl.FlightClient(f"grpc://127.0.0.1:{server.port}")


def _rows(raw: fl.FlightClient, info: fl.FlightInfo) -> list[dict[str, Any]]:
    return raw.do_get(info.endpoints[0].ticket).read_all().to_pylist()


def _idle_workers(server: Any) -> bool:
    pool = server.sql.workers
    return pool._lent == 0


def test_do_get_takes_over_the_statement_started_at_get_flight_info(gateway: Any) -> None:
    raw = _raw(gateway)
    _rows(raw, _info(raw, COUNT))  # a worker started and typed the statement
    early = gateway.sql.early
    before = dict(early.counts)
    info = _info(raw, COUNT)
    assert early.waiting() == 1 and _running(gateway) == 1  # running before its DoGet
    assert _rows(raw, info) == [{"n": 1000}]
    assert early.counts["taken"] == before["taken"] + 1
    assert early.waiting() == 0
    _wait(lambda: _running(gateway) == 0 and _idle_workers(gateway), 10)


def test_a_statement_no_do_get_takes_is_stopped_and_its_ticket_still_runs(gateway: Any) -> None:
    raw = _raw(gateway)
    _rows(raw, _info(raw, COUNT))
    early = gateway.sql.early
    early.wait_s = 0.3
    _info(raw, LONG)  # seconds of work: only its expiry stops it
    assert early.waiting() == 1 and _running(gateway) == 1
    freed = _wait(lambda: _running(gateway) == 0 and _idle_workers(gateway), 10)
    assert freed < 2.0, f"freed after {freed:.2f} s"
    assert early.waiting() == 0 and early.counts["abandoned"] >= 1
    count = _info(raw, COUNT)
    _wait(lambda: early.waiting() == 0, 10)  # expired untaken too
    assert _rows(raw, count) == [{"n": 1000}]  # its ticket runs from scratch


def test_cancelling_a_statement_started_early_stops_it(gateway: Any) -> None:
    raw = _raw(gateway)
    _rows(raw, _info(raw, COUNT))
    info = _info(raw, LONG)
    assert gateway.sql.early.waiting() == 1
    assert _cancel_flight_info(raw, info) == b"\x08\x01"
    assert gateway.sql.early.waiting() == 0 and _running(gateway) == 0  # slots back at once
    _wait(lambda: _idle_workers(gateway), 10)  # the worker once it has stopped
    with pytest.raises(fl.FlightCancelledError):
        _rows(raw, info)


def test_a_statement_started_early_never_makes_another_fail(gateway: Any) -> None:
    """The only statement slot is held by a statement started early: the same caller's next
    FlightInfo (typing takes a slot) and the DoGet of the older ticket both get it."""
    raw = _raw(gateway)
    _rows(raw, _info(raw, COUNT))
    early = gateway.sql.early
    first = _info(raw, COUNT)
    assert early.waiting() == 1
    before = early.counts["abandoned"]
    second = _info(raw, "SELECT count(*) AS n FROM numbers WHERE i < 10")  # typed: a slot
    assert early.counts["abandoned"] == before + 1  # the first gave its slot up
    assert _rows(raw, first) == [{"n": 1000}]  # run again; the second gives its slot up
    assert _rows(raw, second) == [{"n": 10}]
    _wait(lambda: _running(gateway) == 0 and early.waiting() == 0, 10)


def test_callers_running_statements_at_once_all_get_their_rows(tmp_path: Path) -> None:
    """Eight ADBC connections of one principal (a service account), each running statements
    of its own while the others do: every answer right, none refused for slots that
    statements started early held, and nothing left held at the end."""
    import adbc_driver_flightsql.dbapi as flightsql

    limits = {"max_concurrent_statements": 8, "sql_result_cache_mb": 0}
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", limits=limits) as (server, _):
        client = client_for(server)
        _numbers(client, tmp_path / "data", 1000)
        errors: list[BaseException] = []

        def run(n: int) -> None:
            try:
                uri = f"grpc://127.0.0.1:{server.port}"
                with flightsql.connect(uri, autocommit=True) as conn:
                    for i in range(15):
                        below = (n * 15 + i) % 1000 + 1
                        with conn.cursor() as cur:
                            cur.execute(f"SELECT count(*) FROM numbers WHERE i < {below}")
                            assert cur.fetchall() == [(below,)]
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors[:3]
        early = server.sql.early
        assert early.counts["taken"] > 0
        _wait(lambda: _running(server) == 0 and early.waiting() == 0, 10)
        assert server.sql.workers._lent == 0
        client.close()


def test_adbc_statements_start_at_create_prepared_statement(gateway: Any) -> None:
    """ADBC prepares each new statement (CreatePreparedStatement, GetFlightInfo, DoGet): it
    starts at the first, and its FlightInfo and DoGet find it running."""
    import adbc_driver_flightsql.dbapi as flightsql

    early = gateway.sql.early
    with flightsql.connect(f"grpc://127.0.0.1:{gateway.port}", autocommit=True) as conn:
        for n in (10, 20, 30):
            before = dict(early.counts)
            with conn.cursor() as cur:
                cur.execute(f"SELECT count(*) AS n FROM numbers WHERE i < {n}")
                assert cur.fetchall() == [(n,)]
            assert early.counts["started"] - before["started"] <= 1  # not again at its FlightInfo
            assert early.counts["abandoned"] == before["abandoned"]
    assert early.counts["taken"] >= 2  # the first may find no worker started yet
    _wait(lambda: _running(gateway) == 0 and _idle_workers(gateway), 10)


def test_a_statement_started_early_whose_table_was_dropped_is_refused(
    gateway: Any, tmp_path: Path
) -> None:
    """Its DoGet checks the pinned versions as any DoGet does: NOT_FOUND, no rows."""
    raw = _raw(gateway)
    _rows(raw, _info(raw, COUNT))
    info = _info(raw, COUNT)
    assert gateway.sql.early.waiting() == 1
    client = client_for(gateway)
    client.drop_table("numbers")
    with pytest.raises(KeyError, match="does not exist"):  # NOT_FOUND
        _rows(raw, info)
    _wait(lambda: _running(gateway) == 0 and _idle_workers(gateway), 10)
    client.close()


def _count_typings(server: Any, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each typing request of ``server``'s statements from now on (``slots``: whether it took
    the caller's slots)."""
    typed: list[bool] = []
    real = server.sql._typed

    def counted(handle: Any, who: Any, slots: bool = True) -> Any:
        typed.append(slots)
        return real(handle, who, slots)

    monkeypatch.setattr(server.sql, "_typed", counted)
    return typed


def test_a_new_statement_is_typed_by_its_own_result(
    gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new statement's FlightInfo carries the schema its result sent (the statement started
    for its DoGet), with no typing of its own (which bound it a second time); its DoGet
    streams that result, and the next FlightInfo of the same SQL finds the type cached."""
    raw = _raw(gateway)
    _rows(raw, _info(raw, COUNT))  # a worker started (the first statement's is typed)
    _wait(lambda: _idle_workers(gateway), 10)
    typed = _count_typings(gateway, monkeypatch)
    sql = "SELECT i % 7 AS k, count(*) AS n, min(s) AS first FROM numbers GROUP BY k ORDER BY k"
    info = _info(raw, sql)
    assert typed == []
    assert gateway.sql.early.waiting() == 1
    table = raw.do_get(info.endpoints[0].ticket).read_all()
    assert table.schema == info.schema
    assert [r["n"] for r in table.to_pylist()] == [143] * 6 + [142]
    again = _info(raw, sql)
    assert again.schema == info.schema and typed == []
    assert _rows(raw, again) == table.to_pylist()
    _wait(lambda: _running(gateway) == 0 and _idle_workers(gateway), 10)


def test_a_long_new_statement_is_typed_beside_it_on_its_slot(
    gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new statement whose schema does not come within the wait is typed as before, while
    it runs, on the slot it holds (the gateway has one: taking another would stop it)."""
    raw = _raw(gateway)
    _rows(raw, _info(raw, COUNT))
    _wait(lambda: _idle_workers(gateway), 10)
    typed = _count_typings(gateway, monkeypatch)
    info = _info(raw, LONG)
    assert typed == [False]  # typed once, on the running statement's slot
    assert gateway.sql.early.waiting() == 1 and _running(gateway) == 1
    assert info.schema.names == ["c", "k"]
    assert _cancel_flight_info(raw, info) == b"\x08\x01"
    _wait(lambda: _running(gateway) == 0 and _idle_workers(gateway), 10)


def test_a_new_statement_failing_as_it_runs_fails_at_its_do_get(gateway: Any) -> None:
    """A statement that fails on its rows (typing over no rows does not) sends no schema: its
    FlightInfo is typed as before, and its DoGet runs it again and reports the error."""
    raw = _raw(gateway)
    _rows(raw, _info(raw, COUNT))
    _wait(lambda: _idle_workers(gateway), 10)
    info = _info(raw, "SELECT CAST(s AS INTEGER) AS bad FROM numbers")
    assert info.schema.names == ["bad"]
    with pytest.raises((pa.ArrowInvalid, fl.FlightServerError), match=r"(?i)convert|cast"):
        _rows(raw, info)
    _wait(lambda: _running(gateway) == 0 and _idle_workers(gateway), 10)
    assert gateway.sql.early.waiting() == 0


def test_a_gateways_first_statement_waits_for_its_worker_and_starts_early(
    tmp_path: Path,
) -> None:
    """A client's first Flight SQL call starts the gateway's first worker (``warm``); a
    statement sent before it is up waits for it and runs once, started at GetFlightInfo, instead
    of being typed on it apart and run again by its DoGet."""
    limits = {"sql_result_cache_mb": 0}
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", limits=limits) as (server, _):
        client = client_for(server)
        _numbers(client, tmp_path / "data", 1000)
        raw = _raw(server)
        assert server.sql.workers.started == 0
        info = _info(raw, COUNT)  # the gateway's first Flight SQL call
        assert _rows(raw, info) == [{"n": 1000}]
        assert server.sql.early.counts["taken"] == 1
        assert server.sql.workers.started == 1
        client.close()
