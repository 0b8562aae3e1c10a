"""The native Arrow Flight face: Flight calls in, the core's services out.

Protocols carried over Flight (Flight SQL) are ``Carried`` handlers the app mounts: each claims
the commands, tickets and actions that are its own, so this face names none of them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.flight as fl

from flight_gateway.core import metrics
from flight_gateway.core.actions import HANDLERS
from flight_gateway.core.auth import Principal
from flight_gateway.core.config import GatewayConfig
from flight_gateway.core.read import arrow_schema
from flight_gateway.core.services import Core
from flight_gateway.core.write import ingest
from flight_gateway.faces.flight.auth import BearerAuthFactory, HandshakeAuth, principal_of
from flight_gateway.faces.flight.errors import flight_errors, stream_errors
from flight_gateway.faces.flight.read_process import flight_info
from flight_gateway.faces.flight.readers import ReadProcesses
from flight_gateway.faces.flight.tracing import TraceFactory
from flight_gateway.protocol import ReadRequest, actions, decode_json
from flight_gateway.protocol.errors import InvalidArgument

log = logging.getLogger(__name__)


class Carried(Protocol):
    """A protocol carried over Flight (Flight SQL): ``claim`` decodes a command or ticket that
    is its own (None: not its own); the calls receive what it decoded."""

    actions: frozenset[str]

    def claim(self, data: bytes) -> Any | None: ...

    def get_flight_info(
        self, message: Any, descriptor: fl.FlightDescriptor, who: Principal
    ) -> fl.FlightInfo: ...

    def get_schema(self, message: Any, who: Principal) -> pa.Schema: ...

    def do_get(self, message: Any, who: Principal) -> tuple[pa.RecordBatchReader, Any]: ...

    def do_action(self, action_type: str, body: bytes, who: Principal) -> list[bytes]: ...

    def do_put(
        self, message: Any, reader: fl.MetadataRecordBatchReader, who: Principal
    ) -> bytes: ...


def _tls(config: GatewayConfig) -> tuple[list[fl.CertKeyPair], bytes | None]:
    if not config.tls_cert:
        return [], None
    with open(config.tls_cert, "rb") as c, open(config.tls_key or "", "rb") as k:
        certs = [fl.CertKeyPair(c.read(), k.read())]
    if not config.tls_client_ca:
        return certs, None
    with open(config.tls_client_ca, "rb") as ca:
        return certs, ca.read()


class FlightFace(fl.FlightServerBase):
    def __init__(
        self,
        core: Core,
        config: GatewayConfig,
        carried: list[Carried],
        readers: ReadProcesses | None = None,
    ) -> None:
        certs, client_ca = _tls(config)
        self.scheme = "grpc+tls" if certs else "grpc"
        super().__init__(
            f"{self.scheme}://{config.host}:{config.port}",
            middleware={"auth": BearerAuthFactory(config.token_store), "trace": TraceFactory()},
            auth_handler=None if config.token_store.certs else HandshakeAuth(),
            tls_certificates=certs,
            verify_client=client_ca is not None,
            root_certificates=client_ca,
        )
        self.core, self.config, self.carried = core, config, carried
        self.readers = readers  # DoGet streams read in processes of their own, when set
        # Empty locations mean "this same server" to Flight clients; replicas list each other.
        self.locations = [fl.Location(u) for u in config.locations]

    @property
    def uri(self) -> str:
        return f"{self.scheme}://{self.config.host}:{self.port}"

    # ------------------------------------------------------------------ dispatch

    def _claimed(self, data: bytes) -> tuple[Carried, Any] | None:
        for handler in self.carried:
            message = handler.claim(data)
            if message is not None:
                return handler, message
        return None

    def _command(self, descriptor: fl.FlightDescriptor) -> tuple[Carried, Any] | None:
        if descriptor.descriptor_type != fl.DescriptorType.CMD:
            return None
        return self._claimed(descriptor.command)

    @staticmethod
    def _request(descriptor: fl.FlightDescriptor) -> ReadRequest:
        if descriptor.descriptor_type == fl.DescriptorType.PATH:
            return ReadRequest.for_path(list(descriptor.path))
        if descriptor.descriptor_type == fl.DescriptorType.CMD:
            return ReadRequest.from_json(descriptor.command)
        raise InvalidArgument("descriptor must be a path (table name) or a JSON command")

    # ------------------------------------------------------------------ reads

    @flight_errors
    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        principal = principal_of(context)
        claimed = self._command(descriptor)
        if claimed is not None:
            return claimed[0].get_flight_info(claimed[1], descriptor, principal)
        req = self._request(descriptor)
        principal.require("read", req.table)
        if self.readers is not None:  # planned there too (``ReadProcesses.plan``)
            return self.readers.plan(descriptor, principal.name, self.locations)
        return flight_info(self.core.reads.plan(req, principal.name), descriptor, self.locations)

    @flight_errors
    def get_schema(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.SchemaResult:
        principal = principal_of(context)
        claimed = self._command(descriptor)
        if claimed is not None:
            return fl.SchemaResult(claimed[0].get_schema(claimed[1], principal))
        req = self._request(descriptor)
        principal.require("read", req.table)
        _, schema = self.core.reads.schema_for(req)
        return fl.SchemaResult(schema)

    @flight_errors
    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        principal = principal_of(context)
        claimed = self._claimed(ticket.ticket)
        if claimed is not None:
            reader, on_close = claimed[0].do_get(claimed[1], principal)
            return fl.RecordBatchStream(stream_errors(reader, on_close=on_close))
        reads, streams = self.core.reads, self.core.streams
        payload = reads.verify(ticket.ticket, principal.name)
        principal.require("read", payload.table)
        streams.acquire(principal.name)
        try:
            if self.readers is not None:  # counted here: the gateway's metrics see every row
                label = reads.label(payload)
                relayed = self.readers.open(ticket.ticket, principal.name)
                reader = metrics.counted(relayed, payload.table, label)
            else:
                reader = reads.open(payload)
        except BaseException:
            streams.release(principal.name)
            raise
        return fl.RecordBatchStream(
            stream_errors(reader, on_close=lambda: streams.release(principal.name))
        )

    @flight_errors
    def list_flights(
        self, context: fl.ServerCallContext, criteria: bytes
    ) -> Iterator[fl.FlightInfo]:
        principal = principal_of(context)
        infos = []
        for name in self.core.catalog.list_tables():
            if not principal.can("read", name):
                continue
            snap = self.core.reads.snapshot(name)
            meta = json.dumps(
                {"table": name, "version": snap.version, "schema_id": snap.schema.schema_id}
            ).encode()
            infos.append(
                fl.FlightInfo(
                    arrow_schema(snap.schema),
                    fl.FlightDescriptor.for_path(name),
                    [],
                    -1,
                    -1,
                    app_metadata=meta,
                )
            )
        return iter(infos)

    # ------------------------------------------------------------------ actions and writes

    def list_actions(self, context: fl.ServerCallContext) -> list[tuple[str, str]]:
        return list(actions.ACTIONS.items())

    @flight_errors
    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> Iterator[fl.Result]:
        principal = principal_of(context)
        raw = action.body.to_pybytes() if action.body else b""
        for handler in self.carried:
            if action.type in handler.actions:
                return iter([fl.Result(r) for r in handler.do_action(action.type, raw, principal)])
        if action.type == "harness.public_key":  # no table, no secret: anyone authenticated
            key = json.dumps({"public_key": self.core.reads.direct.public_key}).encode()
            return iter([fl.Result(key)])
        if action.type not in HANDLERS:  # UNIMPLEMENTED whatever its body holds
            raise NotImplementedError(f"unknown action {action.type[:100]!r}")
        body = actions.decode(action.type, decode_json(raw, f"body of {action.type}"))
        result = HANDLERS[action.type](self.core.gw, principal, body)
        return iter([fl.Result(json.dumps(result).encode())])

    @flight_errors
    def do_put(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
    ) -> None:
        if descriptor.descriptor_type != fl.DescriptorType.CMD:
            raise InvalidArgument(
                'DoPut needs a command descriptor {"table", "commit_id", "source"?}'
            )
        principal = principal_of(context)
        # Bounded per principal and gateway-wide; over a limit: RESOURCE_EXHAUSTED at once.
        uploads = self.core.uploads
        claimed = self._command(descriptor)
        if claimed is not None:
            with uploads.hold(principal.name), ingest.memory_is_exhaustion("DoPut"):
                meta = claimed[0].do_put(claimed[1], reader, principal)
            writer.write(pa.py_buffer(meta))
            return
        command = decode_json(descriptor.command, "DoPut descriptor")
        ingest.authorize(principal, command)  # before a single byte of data is read
        with uploads.hold(principal.name), ingest.memory_is_exhaustion("DoPut"):
            # Validated and routed whole, before anything is written; bounded in decoded size.
            data = ingest.read_upload(reader, self.core.gw.limits.max_upload_bytes)
            # A stream cut by the client (its process gone, its deadline passed) ends like a
            # finished one for the reader: asked here and again before the commit.
            ingest.check_whole(context.is_cancelled)
            result = ingest.do_put(self.core.gw, principal, command, data, cut=context.is_cancelled)
        writer.write(pa.py_buffer(json.dumps(result).encode()))
