"""DoGet streams read in processes of their own (``read_processes``): the same rows as the
gateway's own reads (a second gateway on the same catalog is the peer), errors with the same
status, a dead process started again, a stream it was serving failed rather than cut short."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from clients import HarnessClient
from flight_gateway.core.config import GatewayConfig
from flight_gateway.protocol.errors import HarnessError
from planners.postgres.versioning import server_now
from tests.gateway.helpers import IcebergFixture, client_for, running_gateway, write_parquet
from tests.gateway.kafka_helpers import produce
from tests.gateway.test_dedupe import msg, three_tiers

pytestmark = pytest.mark.integration


@pytest.fixture
def catalog_file(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'catalog.db'}"


@pytest.fixture
def pair(catalog_file: str):
    """(the gateway's own reads, reads in two processes), one catalog."""
    with (
        running_gateway(catalog_file) as (own, _),
        running_gateway(catalog_file, read_processes=2) as (split, _),
        client_for(own) as a,
        client_for(split) as b,
    ):
        yield a, b, split


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by([(n, "ascending") for n in t.column_names if n != "_deleted"])


def test_reads_match_the_gateways_own_reads(
    pair, kafka_bootstrap: str, pg_dsn: str, iceberg: IcebergFixture
) -> None:
    own, split, _ = pair
    env = three_tiers(own, kafka_bootstrap, pg_dsn, iceberg)
    env["cold"].append(pa.table({"id": [1, 2, 3], "val": ["c1", "c2", "c3"], "seq": [1, 2, 3],
                                 "_deleted": [False] * 3}, schema=env["cold"].schema().as_arrow()))  # fmt: skip
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO \"{env['pg']}\" VALUES (2, 'p2', 10, false), (5, 'p5', 12, false)"
        )
        as_of = server_now(conn)
    offs = produce(kafka_bootstrap, env["topic"], [msg(1, "k1", 20), None], keys=[b"1", b"3"])
    own.commit("t", updates=[
        {"source": "k0", "state": {"low": 0, "high": max(offs) + 1}},
        {"source": "pg", "state": {"as_of": as_of}},
        {"source": "cold", "state": {"snapshot_id": env["cold"].current_snapshot().snapshot_id}},
    ])  # fmt: skip
    for kwargs in [{}, {"dedupe": True}, {"columns": ["id", "val"], "filter": "seq >= 2"}]:
        expected = own.read("t", **kwargs)
        got = split.read("t", **kwargs)
        assert got.num_rows == expected.num_rows > 0, kwargs
        assert _sorted(got).equals(_sorted(expected)), kwargs


def _files_table(client: HarnessClient, root: Path, rows: int) -> Path:
    data = pa.table({"id": pa.array(range(rows), pa.int64())})
    path = Path(write_parquet(root / "a.parquet", data, row_group_size=64 * 1024))
    client.create_table("f", [{"name": "id", "type": "int64"}])
    client.commit("f", add_sources=[{"name": "files", "kind": "files",
        "config": {"format": "parquet", "root": str(root)}, "state": {"files": ["a.parquet"]}}])  # fmt: skip
    return path


def _error(client: HarnessClient, table: str) -> HarnessError:
    with pytest.raises(HarnessError) as raised:
        client.read(table)
    return raised.value


def test_errors_keep_their_status(pair, tmp_path: Path) -> None:
    own, split, _ = pair
    path = _files_table(own, tmp_path / "files", 10)
    path.unlink()  # the pinned version's file is gone: the read fails where it is opened
    expected, got = _error(own, "f"), _error(split, "f")
    assert type(got) is type(expected)
    assert "a.parquet" in str(got)


def _pids(server) -> list[int]:
    return server.readers.pids()


def test_a_read_process_that_died_is_started_again(pair, tmp_path: Path) -> None:
    own, split, server = pair
    _files_table(own, tmp_path / "files", 1000)
    assert split.read("f").num_rows == 1000
    before = _pids(server)
    assert len(before) == 2
    for pid in before:
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    assert split.read("f").num_rows == 1000
    assert split.read("f").num_rows == 1000
    after = _pids(server)
    assert after and not set(after) & set(before)


def test_a_stream_whose_process_dies_fails_instead_of_ending_early(pair, tmp_path: Path) -> None:
    own, _, server = pair
    _files_table(own, tmp_path / "files", 8_000_000)  # far more than gRPC buffers hold
    raw = fl.FlightClient(f"grpc://127.0.0.1:{server.port}")
    info = raw.get_flight_info(fl.FlightDescriptor.for_path("f"))
    [endpoint] = info.endpoints
    stream = raw.do_get(endpoint.ticket)
    first = stream.read_chunk().data
    assert 0 < first.num_rows < 8_000_000
    for pid in _pids(server):
        os.kill(pid, signal.SIGKILL)
    with pytest.raises((fl.FlightError, pa.ArrowException)) as raised:
        stream.read_all()
    assert "read process" in str(raised.value)
    raw.close()


def test_read_processes_end_with_the_gateway(catalog_file: str) -> None:
    with running_gateway(catalog_file, read_processes=1) as (server, _):
        [pid] = _pids(server)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_setting_is_checked() -> None:
    for bad in (-1, 65, True, "2"):
        with pytest.raises(ValueError, match="read_processes"):
            GatewayConfig(read_processes=bad)  # type: ignore[arg-type]
    from flight_gateway.faces.flight.readers import ReadProcesses

    with pytest.raises(ValueError, match="in-memory"):
        ReadProcesses("sqlite://", GatewayConfig(), 1)


def test_an_abandoned_stream_gives_its_place_back(pair, tmp_path: Path) -> None:
    own, split, server = pair
    _files_table(own, tmp_path / "files", 8_000_000)
    raw = fl.FlightClient(f"grpc://127.0.0.1:{server.port}")
    [endpoint] = raw.get_flight_info(fl.FlightDescriptor.for_path("f")).endpoints
    stream = raw.do_get(endpoint.ticket)
    assert stream.read_chunk().data.num_rows > 0
    assert sum(p.streams for p in server.readers._processes) == 1
    stream.cancel()  # the caller goes away mid-stream
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sum(p.streams for p in server.readers._processes):
        time.sleep(0.05)
    assert sum(p.streams for p in server.readers._processes) == 0
    raw.close()
    assert split.read("f").num_rows == 8_000_000  # the read processes serve on


def test_rows_read_elsewhere_are_counted_in_the_gateways_metrics(pair, tmp_path: Path) -> None:
    from flight_gateway.core.metrics import REGISTRY

    own, split, _ = pair
    _files_table(own, tmp_path / "files", 1000)
    labels = {"table": "f", "kind": "files"}

    def served() -> float:
        return REGISTRY.get_sample_value("harness_rows_served_total", labels) or 0.0

    before = served()
    assert split.read("f").num_rows == 1000
    assert served() - before == 1000


def test_reads_are_planned_in_the_read_processes(
    pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GetFlightInfo is planned in a read process too (its tickets signed with the gateway's
    key): the gateway's own planner is never called, and its grant check, errors, direct
    tasks and the caller's descriptor stay as they were."""
    own, split, server = pair
    _files_table(own, tmp_path / "files", 1000)

    def not_here(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("planned in the gateway's process")

    monkeypatch.setattr(server.core.reads, "plan", not_here)
    assert split.read("f").equals(own.read("f"))
    assert split.read("f", direct=True).equals(own.read("f", direct=True))
    assert split.read("f", filter="id < 10").num_rows == 10
    raw = fl.FlightClient(f"grpc://127.0.0.1:{server.port}")
    info = raw.get_flight_info(fl.FlightDescriptor.for_path("f"))
    assert list(info.descriptor.path) == [b"f"]
    assert all(e.expiration_time is not None for e in info.endpoints)
    assert sum(raw.do_get(e.ticket).read_all().num_rows for e in info.endpoints) == 1000
    raw.close()
    for bad in [
        {"table": "missing"},
        {"table": "f", "filter": "nope >"},
        {"table": "f", "version": 10**6},
    ]:
        expected, got = _plan_error(own, bad), _plan_error(split, bad)
        assert type(got) is type(expected), bad
        assert str(got) == str(expected)


def _plan_error(client: HarnessClient, request: dict[str, object]) -> HarnessError:
    with pytest.raises(HarnessError) as raised:
        client.read(**request)  # type: ignore[arg-type]
    return raised.value


def test_bounded_streams_take_turns_batch_by_batch(catalog_file: str, tmp_path: Path) -> None:
    """``read_processes_running = 1``: one stream of the process makes a batch at a time, and
    none keeps the place between batches: four streams read in turns, a batch of each at a
    time, all end whole (a place held across batches would stop the second stream forever)."""
    with (
        running_gateway(catalog_file, read_processes=1, read_processes_running=1) as (server, _),
        client_for(server) as client,
    ):
        _files_table(client, tmp_path / "files", 400_000)
        raw = fl.FlightClient(f"grpc://127.0.0.1:{server.port}")
        tickets = [e.ticket for _ in range(4)
                   for e in raw.get_flight_info(fl.FlightDescriptor.for_path("f")).endpoints]  # fmt: skip
        streams = [raw.do_get(t) for t in tickets]
        rows = [0] * len(streams)
        open_ = set(range(len(streams)))
        while open_:
            for i in sorted(open_):
                try:
                    rows[i] += streams[i].read_chunk().data.num_rows
                except StopIteration:
                    open_.discard(i)
        assert rows == [400_000] * 4
        assert client.read("f").num_rows == 400_000
        raw.close()
    with pytest.raises(ValueError, match="read_processes_running"):
        GatewayConfig(catalog="sqlite://", read_processes_running=-1)
