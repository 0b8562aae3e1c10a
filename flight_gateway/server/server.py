"""The Arrow Flight server of the harness."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as fl
from sqlalchemy.exc import OperationalError

from flight_gateway.catalog import Catalog
from flight_gateway.errors import HarnessError, InvalidArgument, Unavailable
from flight_gateway.protocol import ACTIONS, ReadRequest, TicketSigner, decode_json, to_flight_error
from flight_gateway.server.actions import HANDLERS
from flight_gateway.server.auth import BearerAuthFactory, TokenStore, principal_of
from flight_gateway.server.config import GatewayConfig
from flight_gateway.server.read import ReadService, arrow_schema

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def _flight_errors(fn: F) -> F:
    """Map harness errors to Flight status codes; never let an unexpected error kill a call
    without a clear message (the server itself keeps serving either way)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except HarnessError as e:
            log.info("%s: %s: %s", fn.__name__, type(e).__name__, e)
            raise to_flight_error(e) from e
        except OperationalError as e:
            log.warning("%s: catalog unavailable: %s", fn.__name__, e)
            raise to_flight_error(Unavailable(f"harness catalog unavailable: {e.orig}")) from e
        except (NotImplementedError, fl.FlightError, pa.ArrowException):
            raise
        except Exception as e:
            log.exception("%s failed", fn.__name__)
            raise fl.FlightInternalError(f"internal error: {type(e).__name__}: {e}") from e

    return wrapper  # type: ignore[return-value]


def _stream_errors(reader: pa.RecordBatchReader) -> pa.RecordBatchReader:
    """Errors raised while streaming still reach the client as a failed stream with a clear
    message, never as a stream that ends early looking complete."""

    def gen() -> Iterator[pa.RecordBatch]:
        try:
            yield from reader
        except HarnessError as e:
            raise to_flight_error(e) from e

    return pa.RecordBatchReader.from_batches(reader.schema, gen())


class HarnessFlightServer(fl.FlightServerBase):
    def __init__(self, catalog: Catalog, config: GatewayConfig) -> None:
        tls = bool(config.tls_cert and config.tls_key)
        scheme = "grpc+tls" if tls else "grpc"
        certs = []
        if tls:
            with open(config.tls_cert or "", "rb") as c, open(config.tls_key or "", "rb") as k:
                certs = [fl.CertKeyPair(c.read(), k.read())]
        store = TokenStore.from_config(config.tokens, config.allow_anonymous)
        super().__init__(
            f"{scheme}://{config.host}:{config.port}",
            middleware={"auth": BearerAuthFactory(store)},
            tls_certificates=certs,
        )
        self.catalog = catalog
        self.config = config
        # Empty locations mean "this same server" to Flight clients; replicas list each other.
        self.locations = [fl.Location(u) for u in config.locations]
        self.reads = ReadService(
            catalog, TicketSigner(config.ticket_key_bytes(), config.ticket_ttl_s)
        )
        log.info(
            "harness gateway on %s://%s:%d (catalog %s)",
            scheme,
            config.host,
            self.port,
            catalog.engine.url.render_as_string(hide_password=True),
        )

    @property
    def uri(self) -> str:
        scheme = "grpc+tls" if self.config.tls_cert else "grpc"
        return f"{scheme}://{self.config.host}:{self.port}"

    @staticmethod
    def _request(descriptor: fl.FlightDescriptor) -> ReadRequest:
        if descriptor.descriptor_type == fl.DescriptorType.PATH:
            return ReadRequest.for_path(list(descriptor.path))
        if descriptor.descriptor_type == fl.DescriptorType.CMD:
            return ReadRequest.from_json(descriptor.command)
        raise InvalidArgument("descriptor must be a path (table name) or a JSON command")

    @_flight_errors
    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        req = self._request(descriptor)
        principal_of(context).require("read", req.table)
        planned = self.reads.plan(req)
        endpoints = [
            fl.FlightEndpoint(
                e.ticket,
                self.locations,
                expiration_time=pa.scalar(int(e.expires_at * 1e9), pa.timestamp("ns", tz="UTC")),
            )
            for e in planned.endpoints
        ]
        return fl.FlightInfo(
            planned.schema, descriptor, endpoints, -1, -1, app_metadata=planned.app_metadata()
        )

    @_flight_errors
    def get_schema(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.SchemaResult:
        req = self._request(descriptor)
        principal_of(context).require("read", req.table)
        _, schema = self.reads.schema_for(req)
        return fl.SchemaResult(schema)

    @_flight_errors
    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        payload = self.reads.signer.verify(ticket.ticket)
        principal_of(context).require("read", payload["table"])
        return fl.RecordBatchStream(_stream_errors(self.reads.open(payload)))

    @_flight_errors
    def list_flights(
        self, context: fl.ServerCallContext, criteria: bytes
    ) -> Iterator[fl.FlightInfo]:
        principal = principal_of(context)
        infos = []
        for name in self.catalog.list_tables():
            if not principal.can("read", name):
                continue
            snap = self.reads.snapshot(name)
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

    def list_actions(self, context: fl.ServerCallContext) -> list[tuple[str, str]]:
        return list(ACTIONS.items())

    @_flight_errors
    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> Iterator[fl.Result]:
        handler = HANDLERS.get(action.type)
        if handler is None:
            raise NotImplementedError(f"unknown action {action.type!r}")
        body = decode_json(
            action.body.to_pybytes() if action.body else b"", f"body of {action.type}"
        )
        result = handler(self.catalog, principal_of(context), body)
        return iter([fl.Result(json.dumps(result).encode())])

    @_flight_errors
    def do_put(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
    ) -> None:
        from flight_gateway.server.ingest import do_put

        if descriptor.descriptor_type != fl.DescriptorType.CMD:
            raise InvalidArgument(
                'DoPut needs a command descriptor {"table", "commit_id", "source"?}'
            )
        command = decode_json(descriptor.command, "DoPut descriptor")
        data = reader.read_all()  # validated and routed whole, before anything is written
        result = do_put(self.catalog, principal_of(context), command, data)
        writer.write(pa.py_buffer(json.dumps(result).encode()))
