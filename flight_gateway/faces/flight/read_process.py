"""One read process (``read_processes`` in the gateway's config): DoGet streams served in a
process of their own, so the Python work of reading sources (Kafka messages decoded one by one,
Postgres rows fetched, dataset scans set up) does not take the gateway's interpreter lock from
its writers and its planning.

The gateway starts it as ``python -m flight_gateway.faces.flight.read_process SOCKET`` and
writes the pickled ``(catalog URL, GatewayConfig)`` to its standard input, which it then keeps
open: the process exits when it reads the end of it (the gateway went away). It builds the
same core as the gateway (catalog, secrets, reach, limits, ticket key) and serves Flight on a
Unix socket in a directory only the gateway's user can enter. Its calls are DoGet of a
forwarded ticket: ``{"ticket": <the caller's ticket, base64>, "principal": <name>}``, and
GetFlightInfo of a forwarded read (``forwarded_plan``). The gateway has authenticated the
caller, checked its grant and (for DoGet) taken its stream slot; here a ticket is verified
again (signature, expiry, principal) and opened like any read, and a read planned like any
(its tickets signed with the gateway's key).
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
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from flight_gateway.catalog import Catalog
from flight_gateway.core.config import GatewayConfig
from flight_gateway.core.read.model import PlannedRead
from flight_gateway.core.secrets import ScrubFilter
from flight_gateway.core.services import Core
from flight_gateway.faces.flight.errors import flight_errors, stream_errors
from flight_gateway.protocol import ReadRequest
from flight_gateway.protocol.allocator import tune_for_flight
from planners.registry import warm

log = logging.getLogger(__name__)
READY = b"ready\n"


def forwarded(ticket: bytes, principal: str) -> bytes:
    """The ticket the gateway sends a read process for a caller's ``ticket``."""
    return json.dumps(
        {"ticket": base64.b64encode(ticket).decode(), "principal": principal}
    ).encode()


def forwarded_plan(descriptor: fl.FlightDescriptor, principal: str) -> fl.FlightDescriptor:
    """The descriptor the gateway sends a read process to plan a caller's read."""
    sent: dict[str, Any] = {"principal": principal}
    if descriptor.descriptor_type == fl.DescriptorType.PATH:
        sent["path"] = [bytes(p).decode() for p in descriptor.path]
    else:
        sent["command"] = base64.b64encode(descriptor.command).decode()
    return fl.FlightDescriptor.for_command(json.dumps(sent).encode())


def flight_info(
    planned: PlannedRead, descriptor: fl.FlightDescriptor, locations: list[Any]
) -> fl.FlightInfo:
    endpoints = [
        fl.FlightEndpoint(
            e.ticket,
            locations,
            expiration_time=pa.scalar(int(e.expires_at * 1e9), pa.timestamp("ns", tz="UTC")),
            app_metadata=e.app_metadata(),
        )
        for e in planned.endpoints
    ]
    return fl.FlightInfo(
        planned.schema, descriptor, endpoints, -1, -1, app_metadata=planned.app_metadata()
    )


class ReadProcessServer(fl.FlightServerBase):
    def __init__(self, location: str, core: Core, running: int = 0) -> None:
        super().__init__(location)
        self.core = core
        self.running = threading.BoundedSemaphore(running) if running else None

    @flight_errors
    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        """A forwarded read's plan (``forwarded_plan``): the gateway authenticated the caller
        and checked its grant; the tickets are signed with the same key as the gateway's."""
        sent = json.loads(descriptor.command)
        if "path" in sent:
            req = ReadRequest.for_path(list(sent["path"]))
        else:
            req = ReadRequest.from_json(base64.b64decode(sent["command"]))
        planned = self.core.reads.plan(req, str(sent["principal"]))
        return flight_info(planned, descriptor, [])

    @flight_errors
    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        sent = json.loads(ticket.ticket)
        reads = self.core.reads
        payload = reads.verify(base64.b64decode(sent["ticket"]), str(sent["principal"]))
        if self.running is None:
            return fl.RecordBatchStream(stream_errors(reads.open(payload)))
        with self.running:  # opening plans the source's task: work for the cores too
            reader = reads.open(payload)
        return fl.RecordBatchStream(stream_errors(_paced(reader, self.running)))


def _paced(reader: pa.RecordBatchReader, running: threading.Semaphore) -> pa.RecordBatchReader:
    """``reader``'s batches, each made while holding one of ``running``'s places
    (``read_processes_running``): the others' threads sleep meanwhile instead of sharing the
    cores with the gateway's writers. Between batches the place is free, so a long read
    leaves room for short ones."""

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            while True:
                with running:
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        return
                yield batch
        finally:
            reader.close()

    return pa.RecordBatchReader.from_batches(reader.schema, batches())


def _exit_with_the_gateway(socket: str) -> None:
    """Block until the gateway closes our standard input (it stopped, or died), then exit;
    a gateway that was killed left its sockets' directory behind: removed here."""
    while sys.stdin.buffer.read(1 << 16):
        pass
    shutil.rmtree(os.path.dirname(socket), ignore_errors=True)
    os._exit(0)


def _warm(catalog: Catalog) -> None:
    """The catalog's kinds warmed before the process says it is ready. Its first reads of a
    kind otherwise imported the kind's libraries while holding a place of
    ``read_processes_running`` (PostgreSQL's ADBC driver brings pandas and polars: seconds
    on a loaded machine), and every other stream of the process waited: under failover a
    replica restarted while the other served the readers got them all at once, cold, and
    no read ended for 8-12 s (py-spy of its read processes)."""
    try:
        kinds = catalog.source_kinds()
    except Exception as e:  # the first reads warm what they use
        log.warning("source kinds not warmed: %s", e)
        return
    warm(kinds, wait=True)


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
    catalog = Catalog(catalog_url)
    core = Core.build(catalog, config)
    _warm(catalog)
    server = ReadProcessServer(f"grpc+unix://{argv[0]}", core, config.read_processes_running)
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
