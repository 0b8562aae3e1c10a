"""The Arrow Flight server of the harness: Flight calls in, handlers out."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from flight_gateway import tracing
from flight_gateway.allocator import trim_periodically, tune_for_flight
from flight_gateway.catalog import Catalog
from flight_gateway.errors import InvalidArgument
from flight_gateway.flightsql import service as flightsql
from flight_gateway.protocol import ACTIONS, ReadRequest, TicketSigner, decode_json
from flight_gateway.protocol.direct import DirectSigner
from flight_gateway.secrets import ScrubFilter, SecretResolver
from flight_gateway.server import ingest, metrics
from flight_gateway.server.actions import HANDLERS
from flight_gateway.server.auth import BearerAuthFactory, Principal, principal_of
from flight_gateway.server.config import GatewayConfig
from flight_gateway.server.context import Gateway
from flight_gateway.server.errors import flight_errors, stream_errors
from flight_gateway.server.read import ReadService, arrow_schema
from flight_gateway.server.slots import Slots
from flight_gateway.tracing import TraceFactory
from planners.kafka import consumers

log = logging.getLogger(__name__)


def _install_scrub_filter() -> None:
    """Secret values never reach a log line, whoever logs them (handlers, libraries)."""
    root = logging.getLogger()
    if not any(isinstance(f, ScrubFilter) for f in root.filters):
        root.addFilter(ScrubFilter())
    for handler in root.handlers:
        if not any(isinstance(f, ScrubFilter) for f in handler.filters):
            handler.addFilter(ScrubFilter())


def _tls(config: GatewayConfig) -> tuple[list[fl.CertKeyPair], bytes | None]:
    if not config.tls_cert:
        return [], None
    with open(config.tls_cert, "rb") as c, open(config.tls_key or "", "rb") as k:
        certs = [fl.CertKeyPair(c.read(), k.read())]
    if not config.tls_client_ca:
        return certs, None
    with open(config.tls_client_ca, "rb") as ca:
        return certs, ca.read()


class HarnessFlightServer(fl.FlightServerBase):
    def __init__(self, catalog: Catalog, config: GatewayConfig) -> None:
        # Before gRPC starts its threads: an arena limit set after threads have made their own
        # arenas does not take them back (flight_gateway.allocator).
        tune_for_flight()  # DoPut bodies arrive in gRPC's buffers too
        certs, client_ca = _tls(config)
        self.scheme = "grpc+tls" if certs else "grpc"
        super().__init__(
            f"{self.scheme}://{config.host}:{config.port}",
            middleware={"auth": BearerAuthFactory(config.token_store), "trace": TraceFactory()},
            tls_certificates=certs,
            verify_client=client_ca is not None,
            root_certificates=client_ca,
        )
        _install_scrub_filter()
        if config.tracing:
            tracing.configure(config.tracing)
        trim_periodically()  # free memory scattered in thread arenas goes back to the system
        self.catalog = catalog
        self.config = config
        key = config.ticket_key_bytes()
        self.gw = Gateway(
            catalog,
            SecretResolver(config.secret_names),
            config.reach_policy,
            config.limit_values,
            tag_secret=hmac.new(key, b"write-tags", hashlib.sha256).digest(),
        )
        limits = self.gw.limits
        consumers.POOL.configure(limits.max_kafka_consumers, limits.kafka_consumer_wait_s)
        self.slots = Slots(limits.max_streams_per_principal, "max_streams_per_principal",
                           what="streams")  # fmt: skip
        self.uploads = Slots(limits.max_uploads_per_principal, "max_uploads_per_principal",
                             limits.max_concurrent_uploads, "max_concurrent_uploads",
                             what="uploads")  # fmt: skip
        # Empty locations mean "this same server" to Flight clients; replicas list each other.
        self.locations = [fl.Location(u) for u in config.locations]
        self.reads = ReadService(
            self.gw,
            TicketSigner(key, config.ticket_ttl_s),
            direct=DirectSigner(key, config.ticket_ttl_s),
        )
        # Gateway-wide bound on running statements (each also holds one of its caller's stream
        # slots): every statement may use limits.sql_memory_limit_mb and sql_threads, in a
        # worker process of its own.
        self.statements = Slots(limits.max_concurrent_statements, "max_concurrent_statements",
                                limits.max_concurrent_statements, "max_concurrent_statements",
                                what="SQL statements")  # fmt: skip
        self.sql = flightsql.FlightSqlService(
            self.reads, key, config.ticket_ttl_s, limits.sql(), self.statement_slots,
            workers=limits.max_concurrent_statements,
        )  # fmt: skip
        self.rest = self._iceberg_rest(config)
        metrics.watch_catalog(catalog)
        self._metrics_http = (
            None
            if config.metrics_port is None
            else metrics.serve(config.metrics_port, config.metrics_host)
        )
        if not self.gw.reach.any and not config.reach:
            log.warning("no 'reach' allow-list configured: sources can reach nothing")
        log.info(
            "harness gateway on %s://%s:%d (catalog %s)",
            self.scheme,
            config.host,
            self.port,
            catalog.engine.url.render_as_string(hide_password=True),
        )

    @property
    def metrics_port(self) -> int | None:
        return None if self._metrics_http is None else int(self._metrics_http.server_port)

    def _iceberg_rest(self, config: GatewayConfig) -> Any:
        if config.iceberg_rest_port is None:
            return None
        import tempfile
        from pathlib import Path

        from flight_gateway.rest.server import RestCatalog, RestServer
        from flight_gateway.rest.shadow import Shadows

        root = Path(config.iceberg_rest_dir or tempfile.mkdtemp(prefix="harness-rest-"))
        shadows = Shadows(self.reads, root)
        rest = RestCatalog(shadows, config.token_store, self.catalog)
        server = RestServer(rest, config.host, config.iceberg_rest_port)
        log.info("iceberg rest catalog on http://%s:%d", config.host, server.port)
        return server

    def shutdown(self) -> None:
        if self.rest is not None:
            self.rest.shutdown()
        super().shutdown()
        self.sql.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()

    @property
    def uri(self) -> str:
        return f"{self.scheme}://{self.config.host}:{self.port}"

    @staticmethod
    def _request(descriptor: fl.FlightDescriptor) -> ReadRequest:
        if descriptor.descriptor_type == fl.DescriptorType.PATH:
            return ReadRequest.for_path(list(descriptor.path))
        if descriptor.descriptor_type == fl.DescriptorType.CMD:
            return ReadRequest.from_json(descriptor.command)
        raise InvalidArgument("descriptor must be a path (table name) or a JSON command")

    def _sql(self, descriptor: fl.FlightDescriptor) -> Any | None:
        """The Flight SQL command of a descriptor, or None for a native one."""
        if descriptor.descriptor_type != fl.DescriptorType.CMD:
            return None
        return flightsql.unpack(descriptor.command)

    @flight_errors
    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        sql = self._sql(descriptor)
        if sql is not None:
            return self.sql.get_flight_info(sql, descriptor, principal_of(context))
        req = self._request(descriptor)
        principal = principal_of(context)
        principal.require("read", req.table)
        planned = self.reads.plan(req, principal.name)
        endpoints = [
            fl.FlightEndpoint(
                e.ticket,
                self.locations,
                expiration_time=pa.scalar(int(e.expires_at * 1e9), pa.timestamp("ns", tz="UTC")),
                app_metadata=e.app_metadata(),
            )
            for e in planned.endpoints
        ]
        return fl.FlightInfo(
            planned.schema, descriptor, endpoints, -1, -1, app_metadata=planned.app_metadata()
        )

    @flight_errors
    def get_schema(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.SchemaResult:
        sql = self._sql(descriptor)
        if sql is not None:
            return fl.SchemaResult(self.sql.get_schema(sql, principal_of(context)))
        req = self._request(descriptor)
        principal_of(context).require("read", req.table)
        _, schema = self.reads.schema_for(req)
        return fl.SchemaResult(schema)

    @flight_errors
    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        principal = principal_of(context)
        sql = flightsql.unpack(ticket.ticket)
        if sql is not None:
            return self._sql_stream(sql, principal)
        payload = self.reads.verify(ticket.ticket, principal.name)
        principal.require("read", payload.table)
        self.slots.acquire(principal.name)
        try:
            reader = self.reads.open(payload)
        except BaseException:
            self.slots.release(principal.name)
            raise
        return fl.RecordBatchStream(
            stream_errors(reader, on_close=lambda: self.slots.release(principal.name))
        )

    @contextlib.contextmanager
    def statement_slots(self, name: str) -> Iterator[None]:
        """A stream slot of ``name`` and a gateway-wide statement slot, for typing a statement
        (running one holds them until its stream ends: ``_sql_stream``)."""
        with self.slots.hold(name), self.statements.hold(name):
            yield

    def _sql_stream(self, message: Any, principal: Principal) -> fl.FlightDataStream:
        """A Flight SQL result; a statement holds a stream slot and a statement slot."""
        if not flightsql.is_statement(message):
            return fl.RecordBatchStream(self.sql.do_get(message, principal))
        held: list[Slots] = []
        try:
            for slots in (self.slots, self.statements):
                slots.acquire(principal.name)
                held.append(slots)
            reader = self.sql.do_get(message, principal)
        except BaseException:
            for slots in held:
                slots.release(principal.name)
            raise

        def release() -> None:
            for slots in held:
                slots.release(principal.name)

        return fl.RecordBatchStream(stream_errors(reader, on_close=release))

    @flight_errors
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

    @flight_errors
    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> Iterator[fl.Result]:
        if action.type == "harness.public_key":  # no table, no secret: anyone authenticated
            principal_of(context)
            key = json.dumps({"public_key": self.reads.direct.public_key}).encode()
            return iter([fl.Result(key)])
        if not action.type.startswith("harness."):
            body = action.body.to_pybytes() if action.body else b""
            results = self.sql.do_action(action.type, body, principal_of(context))
            return iter([fl.Result(r) for r in results])
        handler = HANDLERS.get(action.type)
        if handler is None:
            raise NotImplementedError(f"unknown action {action.type!r}")
        body = decode_json(
            action.body.to_pybytes() if action.body else b"", f"body of {action.type}"
        )
        result = handler(self.gw, principal_of(context), body)
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
        uploads = self.uploads
        sql = self._sql(descriptor)
        if sql is not None:
            with uploads.hold(principal.name), ingest.memory_is_exhaustion("DoPut"):
                meta = self.sql.do_put(sql, reader, principal)
            writer.write(pa.py_buffer(meta))
            return
        command = decode_json(descriptor.command, "DoPut descriptor")
        ingest.authorize(principal, command)  # before a single byte of data is read
        with uploads.hold(principal.name), ingest.memory_is_exhaustion("DoPut"):
            # Validated and routed whole, before anything is written; bounded in decoded size.
            data = ingest.read_upload(reader, self.gw.limits.max_upload_bytes)
            result = ingest.do_put(self.gw, principal, command, data)
        writer.write(pa.py_buffer(json.dumps(result).encode()))
