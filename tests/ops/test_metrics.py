"""The Prometheus endpoint: after reads, commits, a lock and an auth failure the counters moved."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import Conflict, Unauthenticated
from tests.gateway.helpers import running_gateway


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) ([0-9.eE+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def _value(metrics: dict[str, float], name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # exposition order
    key = f"{name}{{{want}}}" if labels else name
    return metrics.get(key, 0.0)


def test_counters_move(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": list(range(100))}), tmp_path / "a.parquet")
    config = {
        "tokens": {"secret-writer-token": {"name": "w", "admin": ["*"]}},
        "reach": {"paths": [str(tmp_path)]},
        "metrics_port": 0,
    }
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", allow_anonymous=False, **config) as (
        server,
        _cat,
    ):
        assert server.metrics_port
        before = _scrape(server.metrics_port)
        c = HarnessClient(f"grpc://127.0.0.1:{server.port}", token="secret-writer-token")
        c.create_table("m", [{"name": "id", "type": "int64"}])
        c.add_source(
            "m", "f", "files", config={"root": str(tmp_path)}, state={"files": ["a.parquet"]}
        )
        assert c.read("m").num_rows == 100
        with c.lock("m", ["f"], owner="x", ttl_s=30), pytest.raises(Conflict):
            c.commit("m", updates=[{"source": "f", "state": {"files": []}}])
        with pytest.raises(Unauthenticated):
            HarnessClient(f"grpc://127.0.0.1:{server.port}", token="wrong").list_tables()
        c.close()
        after = _scrape(server.metrics_port)

    def moved(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert moved("harness_rows_served_total", table="m", kind="files") == 100
    assert moved("harness_bytes_served_total", table="m", kind="files") > 0
    assert moved("harness_commits_total", table="m", outcome="applied") == 1
    assert moved("harness_commits_total", table="m", outcome="FAILED_PRECONDITION") == 1
    assert moved("harness_rpc_total", method="do_get", status="OK") >= 1
    assert moved("harness_rpc_total", method="do_action", status="FAILED_PRECONDITION") == 1
    assert moved("harness_rpc_seconds_count", method="get_flight_info") >= 1
    assert moved("harness_lock_requests_total", outcome="granted") == 1
    assert moved("harness_auth_failures_total") >= 1
    assert _value(after, "harness_group_commit_commits_total") >= 2


def test_memory_gauges_say_where_the_memory_is(tmp_path: Path) -> None:
    """glibc malloc in use and free, Arrow's pool, threads and open Kafka consumers, read when
    scraped: a table read into memory in this process shows in Arrow's gauge."""
    import threading

    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", metrics_port=0) as (server, _):
        held = pa.table({"x": pa.array(range(1_000_000), pa.int64())})
        scraped = _scrape(server.metrics_port)
        assert _value(scraped, "harness_arrow_allocated_bytes") >= held.nbytes
        assert _value(scraped, "harness_malloc_bytes", state="in_use") > 0
        assert _value(scraped, "harness_threads") >= threading.active_count()
        assert (
            _value(scraped, "harness_kind_resources", kind="kafka", resource="consumers_open") == 0
        )
        del held
