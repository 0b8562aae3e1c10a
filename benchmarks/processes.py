"""Gateways as real processes, started on a fixed loopback port and SIGKILLed at will."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from clients import HarnessClient
from flight_gateway.local.kafka import free_port

ROOT = Path(__file__).resolve().parents[1]  # the project root
TICKET_KEY = "chaos-ticket-key-0123456789abcdef"


class GatewayProcess:
    """``harness-gateway serve`` in a child process; ``kill`` is SIGKILL, ``start`` reuses the
    port so clients keep their address across restarts."""

    def __init__(
        self, catalog_url: str, workdir: Path, env: dict[str, str] | None = None, **config: Any
    ) -> None:
        self.catalog_url = catalog_url
        self.env = dict(env or {})  # for its process (fault injection in the kill tests)
        self.port = free_port()
        self.config = workdir / f"gateway-{self.port}.json"
        self.config.write_text(json.dumps({"ticket_key": TICKET_KEY, **config}))
        self.log = workdir / f"gateway-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0

    @property
    def uri(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60) -> float:
        """Start and wait until it answers; returns when it did (monotonic seconds)."""
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "flight_gateway.cli",
                    "serve",
                    "--catalog",
                    self.catalog_url,
                    "--port",
                    str(self.port),
                    "--allow-anonymous",
                    "--config",
                    str(self.config),
                ],
                env={**os.environ, "PYTHONPATH": str(ROOT), **self.env},
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with HarnessClient(self.uri) as client:
                    client.list_tables()
                return time.monotonic()
            except Exception as e:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = self.log.read_text()[-2000:]
                    raise RuntimeError(f"gateway did not start: {tail}") from e
                time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.kills += 1

    def rss_mb(self) -> float:
        """Resident memory of the running process (Linux /proc), MB."""
        return self.resident().get("VmRSS", float("nan"))

    def resident(self) -> dict[str, float]:
        """Resident memory of the running gateway, MB: ``VmRSS`` and its parts ``RssAnon``
        (heaps, stacks, allocator regions) and ``RssFile`` (mapped libraries and files),
        summed over the process and its children (read processes, Flight SQL workers, the
        lease watcher): memory a gateway moves into a child still counts."""
        assert self.proc is not None
        out: dict[str, float] = {}
        for pid in [self.proc.pid, *child_pids(self.proc.pid)]:
            try:
                lines = Path(f"/proc/{pid}/status").read_text().splitlines()
            except OSError:  # ended meanwhile
                continue
            for line in lines:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    out[key] = out.get(key, 0.0) + int(value.split()[0]) / 1024
        return out

    def breakdown(self) -> dict[str, float]:
        """What the gateway's metrics say of its memory (MB: glibc malloc in use / free /
        mmapped, Arrow), its malloc arenas, threads and open Kafka consumers; empty without
        ``metrics_port`` in its config."""
        port = json.loads(self.config.read_text()).get("metrics_port")
        if port is None:
            return {}
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        names = {
            'harness_malloc_bytes{state="in_use"}': "malloc in use MB",
            'harness_malloc_bytes{state="free"}': "malloc free MB",
            'harness_malloc_bytes{state="mmapped"}': "malloc mmapped MB",
            "harness_arrow_allocated_bytes": "arrow MB",
            "harness_malloc_arenas": "malloc arenas",
            "harness_threads": "threads",
            'harness_kind_resources{kind="kafka",resource="consumers_open"}': "kafka consumers",
        }
        out = {}
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name in names:
                scale = 1 / 2**20 if names[name].endswith("MB") else 1
                out[names[name]] = float(value) * scale
        return out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def child_pids(pid: int | str = "self") -> list[str]:
    """The processes ``pid`` started (Linux ``/proc/<pid>/task/*/children``)."""
    out: list[str] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += (task / "children").read_text().split()
        except OSError:  # the thread ended meanwhile
            continue
    return out
