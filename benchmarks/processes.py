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
from flight_gateway.local_kafka import free_port

ROOT = Path(__file__).resolve().parents[2]
TICKET_KEY = "chaos-ticket-key-0123456789abcdef"


class GatewayProcess:
    """``harness-gateway serve`` in a child process; ``kill`` is SIGKILL, ``start`` reuses the
    port so clients keep their address across restarts."""

    def __init__(self, catalog_url: str, workdir: Path, **config: Any) -> None:
        self.catalog_url = catalog_url
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
                env={**os.environ, "PYTHONPATH": str(ROOT)},
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
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
