"""glibc malloc settings of a gateway process (``flight_gateway.protocol.allocator``), checked in a child
process so that this test run's own allocator is left as it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import ctypes, threading
from flight_gateway.protocol.allocator import trim_periodically, tune_for_flight
assert tune_for_flight() and trim_periodically(every_s=0.05)
assert trim_periodically()  # once per process
buf = [ctypes.create_string_buffer(1 << 16) for _ in range(2000)]  # 128 MB, then freed
del buf
import time; time.sleep(0.3)
assert any(t.name == "harness-malloc-trim" for t in threading.enumerate())
print("trimming")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_a_gateway_process_trims_malloc_periodically() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(PYTHONPATH=str(ROOT), HARNESS_MALLOC_TUNING="1")
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "trimming" in out.stdout


def test_no_trimming_without_the_tuning() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_MALLOC_TUNING": "0"}
    code = (
        "from flight_gateway.protocol.allocator import trim_periodically, tune_for_flight\n"
        "assert not tune_for_flight() and not trim_periodically()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_a_busy_gateway_stays_within_its_malloc_arenas(tmp_path: Path) -> None:
    """`harness-gateway serve` limits malloc to two arenas per core before gRPC starts its
    threads: a limit set later leaves the arenas those threads already made (9 were counted
    on 2 cores when it was set after the Flight server had started)."""
    import threading

    from benchmarks.processes import GatewayProcess
    from clients import HarnessClient
    from flight_gateway.local.kafka import free_port
    from flight_gateway.protocol.allocator import ARENA_MAX

    gw = GatewayProcess(f"sqlite:///{tmp_path / 'c.db'}", tmp_path, metrics_port=free_port())
    gw.start()
    try:
        with HarnessClient(gw.uri) as client:
            client.create_table("t", [{"name": "x", "type": "int64"}])

        def busy() -> None:
            with HarnessClient(gw.uri) as client:
                for _ in range(30):
                    client.describe("t")
                    client.list_tables()

        threads = [threading.Thread(target=busy) for _ in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        memory = gw.breakdown()
    finally:
        gw.stop()
    assert "malloc arenas" in memory, "no harness_malloc_arenas gauge"
    assert 1 <= memory["malloc arenas"] <= max(2, ARENA_MAX)
