"""One read process (``read_processes`` in the gateway's config): DoGet streams served in a
process of their own, so the Python work of reading sources (Kafka messages decoded one by one,
Postgres rows fetched, dataset scans set up) does not take the gateway's interpreter lock from
its writers and its planning.

The gateway starts it as ``python -m flight_gateway.faces.flight.read_process SOCKET`` and
writes the pickled ``(catalog URL, GatewayConfig)`` to its standard input, which it then keeps
open: the process exits when it reads the end of it (the gateway went away). It builds the
same core as the gateway (catalog, secrets, reach, limits, ticket key) and serves Flight on a
Unix socket in a directory only the gateway's user can enter. Its one call is DoGet of a
forwarded ticket: ``{"ticket": <the caller's ticket, base64>, "principal": <name>}``. The
gateway has authenticated the caller, checked its grant and taken its stream slot; here the
ticket is verified again (signature, expiry, principal) and opened like any read.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import shutil
import sys
import threading
from typing import Any

import pyarrow.flight as fl

from flight_gateway.catalog import Catalog
from flight_gateway.core.config import GatewayConfig
from flight_gateway.core.secrets import ScrubFilter
from flight_gateway.core.services import Core
from flight_gateway.faces.flight.errors import flight_errors, stream_errors
from flight_gateway.protocol.allocator import tune_for_flight

log = logging.getLogger(__name__)
READY = b"ready\n"


def forwarded(ticket: bytes, principal: str) -> bytes:
    """The ticket the gateway sends a read process for a caller's ``ticket``."""
    return json.dumps(
        {"ticket": base64.b64encode(ticket).decode(), "principal": principal}
    ).encode()


class ReadProcessServer(fl.FlightServerBase):
    def __init__(self, location: str, core: Core) -> None:
        super().__init__(location)
        self.core = core

    @flight_errors
    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        sent = json.loads(ticket.ticket)
        reads = self.core.reads
        payload = reads.verify(base64.b64decode(sent["ticket"]), str(sent["principal"]))
        return fl.RecordBatchStream(stream_errors(reads.open(payload)))


def _exit_with_the_gateway(socket: str) -> None:
    """Block until the gateway closes our standard input (it stopped, or died), then exit;
    a gateway that was killed left its sockets' directory behind: removed here."""
    while sys.stdin.buffer.read(1 << 16):
        pass
    shutil.rmtree(os.path.dirname(socket), ignore_errors=True)
    os._exit(0)


def main(argv: list[str]) -> int:
    tune_for_flight()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s read process %(message)s")
    logging.getLogger().addFilter(ScrubFilter())
    size = int.from_bytes(sys.stdin.buffer.read(8), "big")
    catalog_url, config = pickle.loads(sys.stdin.buffer.read(size))
    assert isinstance(config, GatewayConfig)
    # Below the gateway's priority: when the cores are busy, its writers and planning go first
    # and the reads take what is left (the readers' share, not the writers', waits).
    os.nice(config.read_processes_nice)
    core = Core.build(Catalog(catalog_url), config)
    server = ReadProcessServer(f"grpc+unix://{argv[0]}", core)
    threading.Thread(
        target=_exit_with_the_gateway, args=(argv[0],), name="parent-watch", daemon=True
    ).start()
    sys.stdout.buffer.write(READY)
    sys.stdout.buffer.flush()
    server.serve()
    return 0


def _run() -> Any:  # pragma: no cover - the process's entry point
    return main(sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_run())
