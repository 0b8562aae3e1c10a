"""The Iceberg REST face's HTTP server (Tornado, on its own event loop thread of the gateway).

Bounded like the Flight face: TLS and mutual TLS from the gateway's config (a client
certificate's name is a principal, as on Flight); every request's headers within
``header_timeout_s`` (a half-sent request holds no thread and is closed then); at most
``max_connections`` open connections and ``max_requests`` answered at once (503 beyond);
small request bodies only (the face is read-only). Answers run in a small thread pool, so the
event loop keeps accepting and refusing while a load makes slices.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flight_gateway.core.auth import Principal
from flight_gateway.core.config import GatewayConfig, RestSettings
from flight_gateway.core.slots import Slots
from flight_gateway.faces.iceberg_rest.catalog import (
    ALLOWED,
    Request,
    RestCatalog,
    RestError,
    error_body,
)
from flight_gateway.faces.iceberg_rest.metadata import MetadataWriter
from flight_gateway.protocol.errors import Busy

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 64 * 1024
MAX_HEADER_BYTES = 64 * 1024
#: What Tornado reads of a request's headers before it closes the connection unanswered
#: (nothing of ours has run yet): headers past ``MAX_HEADER_BYTES`` and within this get 431.
READ_HEADER_BYTES = 2 * MAX_HEADER_BYTES
#: Tornado's own bound on a body, past which it answers a bare 400: far above ours, which the
#: handler checks as the body arrives (discarded: the face reads no body) and answers 413.
READ_BODY_BYTES = 1 << 30
#: How much of a body past ``MAX_BODY_BYTES`` is read and dropped before the 413, so the
#: answer is not lost to a reset; past it the 413 goes at once.
DRAIN_BYTES = 1 << 20
#: How often a request waiting for a place among its principal's requests looks again.
PLACE_POLL_S = 0.01


def certificate_name(cert: dict[str, Any] | None) -> str:
    """A peer certificate's name as Flight's ``peer_identity`` gives it: its first subject
    alternative name, else its common name."""
    if not cert:
        return ""
    for _, value in cert.get("subjectAltName", ()):
        return str(value)
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


def tls_context(config: GatewayConfig) -> ssl.SSLContext | None:
    """The Flight face's TLS settings for HTTPS (mutual TLS with ``tls_client_ca``)."""
    if not config.tls_cert:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(config.tls_cert, config.tls_key)
    if config.tls_client_ca:
        ctx.load_verify_locations(config.tls_client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _application(
    rest: RestCatalog, pools: tuple[ThreadPoolExecutor, ThreadPoolExecutor],
    settings: RestSettings, settings_tls: ssl.SSLContext | None,
) -> Any:  # fmt: skip
    import tornado.web
    from tornado.iostream import StreamClosedError

    in_flight = [0]
    waiting: dict[str, int] = {}  # requests waiting for a place, per principal (event loop only)

    async def _placed(name: str) -> bool:
        """Whether ``name`` got a place among its requests within ``request_wait_s``."""
        waiting[name] = waiting.get(name, 0) + 1
        try:
            deadline = time.monotonic() + settings.request_wait_s
            while not rest.answering.try_acquire(name):
                if time.monotonic() >= deadline:
                    return False
                await asyncio.sleep(PLACE_POLL_S)
            return True
        finally:
            waiting[name] -= 1
            if not waiting[name]:
                del waiting[name]

    @tornado.web.stream_request_body
    class Handler(tornado.web.RequestHandler):
        def prepare(self) -> None:
            # Limits checked here, not by Tornado, so a request past them gets the error
            # model. A body past MAX_BODY_BYTES is read (and dropped) up to DRAIN_BYTES before
            # the 413: a connection closed with a body unread is reset, and the reset can
            # reach the client before it reads the answer. Past DRAIN_BYTES the answer goes at
            # once and the connection closes.
            self._received = 0
            self.request.connection.set_max_body_size(READ_BODY_BYTES)  # type: ignore[union-attr]
            length = self.request.headers.get("Content-Length", "")
            if _header_bytes(self.request) > MAX_HEADER_BYTES:
                self._refuse(431, "RequestHeaderFieldsTooLargeException",
                             f"request headers past {MAX_HEADER_BYTES >> 10} KB")  # fmt: skip
            elif length.isdigit() and int(length) > DRAIN_BYTES:
                self._too_large(close=True)

        def data_received(self, chunk: bytes) -> None:
            self._received += len(chunk)  # dropped: no route takes a body
            if self._received > DRAIN_BYTES and not self._finished:
                self._too_large(close=True)

        def _too_large(self, close: bool) -> None:
            error = RestError(413, "ContentTooLargeException",
                              f"request body past {MAX_BODY_BYTES >> 10} KB: this catalog takes "
                              "no request bodies (it is read-only)")  # fmt: skip
            if close:
                self.set_header("Connection", "close")
            self._send(*error_body(error))

        def _refuse(self, code: int, kind: str, message: str) -> None:
            self.set_header("Connection", "close")
            self._send(*error_body(RestError(code, kind, message)))

        async def _answer(self) -> None:
            if self._received > MAX_BODY_BYTES:  # read whole (within DRAIN_BYTES): no reset
                self._too_large(close=False)
                return
            if in_flight[0] >= settings.max_requests:
                self._send(*error_body(RestError(
                    503, "SlowDownException",
                    f"the catalog is answering {settings.max_requests} requests "
                    "(iceberg_rest.max_requests); retry later",
                )))  # fmt: skip
                return
            in_flight[0] += 1
            try:
                query = {k: [v.decode(errors="replace") for v in vs]
                         for k, vs in self.request.query_arguments.items()}  # fmt: skip
                req = Request(
                    self.request.method or "GET",
                    self.request.path,
                    query,
                    self.request.headers.get("Authorization"),
                    self._peer(),
                )
                admitted = rest.admit(req)
                if not isinstance(admitted, Principal):
                    self._send(*admitted)
                    return
                await self._respond(req, admitted)
            finally:
                in_flight[0] -= 1

        async def _respond(self, req: Request, who: Principal) -> None:
            # The place among the principal's requests is waited for here, on the event
            # loop: a request waiting on a pool thread held one of the 16 load threads (or
            # of the 2 quick ones) that other principals' requests queued behind. At most as
            # many wait as may be answered: waiters count against max_requests, which the
            # other principals share.
            answering, name = rest.answering, who.name
            placed = answering.try_acquire(name) or (
                waiting.get(name, 0) < answering.per_principal and await _placed(name)
            )
            if not placed:
                self._send(*error_body(Busy(answering.why_full(name))))
                return
            try:
                pool = pools[0] if is_load(req.path) else pools[1]
                loop = asyncio.get_running_loop()
                self._send(*await loop.run_in_executor(pool, rest.respond, req, who))
            finally:
                answering.release(who.name)

        def _peer(self) -> str:
            if settings_tls is None:  # a plain socket has no peer certificate
                return ""
            cert = self.request.get_ssl_certificate()
            return certificate_name(cert if isinstance(cert, dict) else None)

        def write_error(self, status_code: int, **kwargs: Any) -> None:
            # Tornado's own errors (and ours past _answer) as the protocol's JSON, no trace.
            if status_code == 405:  # a method Tornado knows no handler method for (TRACE)
                method = (self.request.method or "")[:20]
                kind, reason = (
                    "MethodNotAllowedException",
                    (f"{method} is not a method of this resource: it allows {', '.join(ALLOWED)}"),
                )
            elif status_code >= 500:
                kind, reason = "ServiceFailureException", "internal error"
            else:
                kind, reason = "BadRequestException", self._reason
            self._send(status_code, {"error": {"message": reason, "code": status_code,
                                               "type": kind}})  # fmt: skip

        def _send(self, code: int, body: dict[str, Any] | None) -> None:
            self.set_status(code)
            self.set_header("Content-Type", "application/json")
            if code == 405:
                self.set_header("Allow", ", ".join(ALLOWED))
            if body is not None and self.request.method != "HEAD":
                self.finish(json.dumps(body))
            else:
                self.finish()

        get = head = post = put = delete = patch = options = _answer

        def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
            if isinstance(value, StreamClosedError):  # closed after a refusal (413, 431)
                log.debug("iceberg rest: connection closed: %s", value)
                return
            if isinstance(value, tornado.web.HTTPError):  # a caller's request (TRACE, ...)
                log.debug("iceberg rest: %s", value)
                return
            log.error("iceberg rest: %s", value, exc_info=(typ, value, tb))

    return tornado.web.Application([(r"/.*", Handler)], log_function=_access)


def _header_bytes(request: Any) -> int:
    """The size of a request's start line and headers as sent (near enough: CRLFs counted)."""
    line = len(request.method or "") + len(request.uri or "") + len(request.version or "") + 4
    return line + sum(len(k) + len(v) + 4 for k, v in request.headers.get_all())


def is_load(path: str) -> bool:
    """Whether ``path`` is a table's (``.../tables/{table}``): a load, which may wait on its
    sources; every other route is answered from the catalog alone."""
    parts = [p for p in path.split("/") if p]
    return len(parts) >= 2 and parts[-2] == "tables"


def _access(handler: Any) -> None:
    log.debug("iceberg rest: %s %s %d", handler.request.method, handler.request.path,
              handler.get_status())  # fmt: skip


class RestServer:
    """The HTTP server on its own event loop thread."""

    def __init__(
        self, rest: RestCatalog, settings: RestSettings, host: str, port: int,
        tls: ssl.SSLContext | None,
    ) -> None:  # fmt: skip
        self.rest, self.settings, self.tls = rest, settings, tls
        self.pool = ThreadPoolExecutor(
            max_workers=min(settings.max_requests, 16), thread_name_prefix="iceberg-rest"
        )
        # Everything but a table's load (config, namespaces, table lists) is answered from
        # the catalog alone, on threads of its own: never behind loads waiting on sources.
        self.quick = ThreadPoolExecutor(max_workers=2, thread_name_prefix="iceberg-rest-quick")
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self.port = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(host, port), daemon=True,
                                       name="iceberg-rest-loop")  # fmt: skip
        self.thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        self._sweeper = threading.Thread(target=self._sweep, daemon=True, name="iceberg-rest-sweep")
        self._sweeper.start()

    def _run(self, host: str, port: int) -> None:
        import tornado.httpserver
        import tornado.netutil

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        limit = self.settings.max_connections

        class Bounded(tornado.httpserver.HTTPServer):
            def handle_stream(self, stream: Any, address: Any) -> None:
                if len(self._connections) >= limit:  # refused before a byte is read
                    stream.close()
                    return
                super().handle_stream(stream, address)

        try:
            server = Bounded(
                _application(self.rest, (self.pool, self.quick), self.settings, self.tls),
                ssl_options=self.tls,
                idle_connection_timeout=self.settings.header_timeout_s,
                body_timeout=self.settings.header_timeout_s,
                max_header_size=READ_HEADER_BYTES,
                max_body_size=READ_BODY_BYTES,
            )
            sockets = tornado.netutil.bind_sockets(port, host)
            server.add_sockets(sockets)
            self.port = int(sockets[0].getsockname()[1])
            self._server = server
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(server.close_all_connections())
        loop.close()

    def _sweep(self) -> None:
        while not self._stop.wait(self.settings.sweep_s):
            try:
                self.rest.layouts.sweep()
            except Exception:  # logged; the next sweep tries again
                log.exception("iceberg rest: sweep failed")

    def shutdown(self) -> None:
        self._stop.set()
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(self._server.stop)
            loop.call_soon_threadsafe(loop.stop)
        self.thread.join(10)
        self.pool.shutdown(wait=False, cancel_futures=True)  # the store is the core's
        self.quick.shutdown(wait=False, cancel_futures=True)


def mount(core: Any, config: GatewayConfig) -> RestServer:
    """The REST face of ``core`` on ``config.iceberg_rest_port``."""
    settings = config.rest_settings
    layouts = core.layouts  # shared with Flight SQL: a hot slice is made once for both
    store, root = layouts.store, layouts.store.root
    loads = Slots(settings.max_loads_per_principal, "iceberg_rest.max_loads_per_principal",
                  settings.max_concurrent_loads, "iceberg_rest.max_concurrent_loads",
                  what="loads making slices")  # fmt: skip
    answering = Slots(
        settings.max_requests_per_principal,
        "iceberg_rest.max_requests_per_principal",
        what="requests being answered",
    )
    rest = RestCatalog(core.reads, config.token_store, layouts,
                       MetadataWriter(store, settings.history, layouts.sweep), loads, answering)  # fmt: skip
    server = RestServer(rest, settings, config.host, config.iceberg_rest_port or 0,
                        tls_context(config))  # fmt: skip
    scheme = "https" if config.tls_cert else "http"
    log.info("iceberg rest catalog on %s://%s:%d (slices in %s)", scheme, config.host,
             server.port, root)  # fmt: skip
    return server
