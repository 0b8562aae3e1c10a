"""An Iceberg REST catalog (read side) over harness tables, for engines without Flight (Trino,
StarRocks, ClickHouse, Flink, DuckDB, pyiceberg): ``GET /v1/config``, namespaces (one:
``harness``), tables listed per the caller's read permission, and ``loadTable`` whose metadata's
current snapshot is the pinned harness version (the latest, or ``?version=N``; earlier loaded
versions are in the snapshot log for time travel). Bearer tokens as on Flight. Every write is
refused: writes go through DoPut and DoAction.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from flight_gateway.errors import HarnessError, NotFound, Unauthenticated, Unauthorized
from flight_gateway.rest.shadow import NAMESPACE, Shadows
from flight_gateway.server.auth import Principal, TokenStore

log = logging.getLogger(__name__)


class _Error(Exception):
    def __init__(self, code: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.code, self.kind = code, kind


def _status(e: BaseException) -> _Error:
    if isinstance(e, _Error):
        return e
    if isinstance(e, Unauthenticated):
        return _Error(401, "NotAuthorizedException", str(e))
    if isinstance(e, Unauthorized):
        return _Error(403, "ForbiddenException", str(e))
    if isinstance(e, NotFound):
        return _Error(404, "NoSuchTableException", str(e))
    if isinstance(e, HarnessError):
        return _Error(400, "BadRequestException", str(e))
    log.error("iceberg rest: internal error", exc_info=e)
    return _Error(500, "ServiceFailureException", f"internal error: {type(e).__name__}")


class RestCatalog:
    def __init__(self, shadows: Shadows, tokens: TokenStore, catalog: Any) -> None:
        self.shadows, self.tokens, self.catalog = shadows, tokens, catalog

    def principal(self, header: str | None) -> Principal:
        scheme, _, token = (header or "").partition(" ")
        token = token.strip()
        # pyiceberg's RestCatalog without a token sends "Bearer None": that is no token.
        if not header or (scheme.lower() == "bearer" and token in ("", "None")):
            if self.tokens.allow_anonymous:
                return self.tokens.anonymous
            raise Unauthenticated("missing 'Authorization: Bearer <token>'")
        found = self.tokens.lookup(token) if scheme.lower() == "bearer" else None
        if found is None:
            raise Unauthenticated("invalid bearer token")
        return found

    def get(self, path: str, query: dict[str, list[str]], who: Principal) -> dict[str, Any]:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:1] == ["v1"]:
            parts = parts[1:]
        if parts and parts[0] not in ("config", "namespaces"):
            parts = parts[1:]  # an optional prefix
        if parts == ["config"]:
            return {"defaults": {}, "overrides": {}}
        if parts == ["namespaces"]:
            return {"namespaces": [[NAMESPACE]]}
        if len(parts) < 2 or parts[0] != "namespaces" or parts[1] != NAMESPACE:
            raise _Error(404, "NoSuchNamespaceException", f"no namespace {parts[1:2]}")
        if len(parts) == 2:
            return {"namespace": [NAMESPACE], "properties": {}}
        if parts[2:] == ["tables"]:
            names = [t for t in self.catalog.list_tables() if who.can("read", t)]
            return {"identifiers": [{"namespace": [NAMESPACE], "name": t} for t in names]}
        if len(parts) == 4 and parts[2] == "tables":
            return self.load(parts[3], query, who)
        raise _Error(404, "NotFoundException", f"no such resource: {path}")

    def load(self, table: str, query: dict[str, list[str]], who: Principal) -> dict[str, Any]:
        if not who.can("read", table):  # a table the caller may not read does not exist
            raise _Error(404, "NoSuchTableException", f"no table {NAMESPACE}.{table}")
        version = int(query["version"][0]) if query.get("version") else None
        itable = self.shadows.load(table, version)
        return {
            "metadata-location": itable.metadata_location,
            "metadata": json.loads(itable.metadata.model_dump_json(by_alias=True)),
            "config": {},
        }


def _handler(rest: RestCatalog) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict[str, Any] | None) -> None:
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _answer(self) -> None:
            url = urlparse(self.path)
            try:
                who = rest.principal(self.headers.get("Authorization"))
                if self.command not in ("GET", "HEAD"):
                    raise _Error(
                        405 if self.command != "POST" else 403,
                        "ForbiddenException",
                        "this catalog is read-only: write through the gateway's DoPut and DoAction",
                    )
                body = rest.get(url.path, parse_qs(url.query), who)
                self._send(200 if self.command == "GET" else 204, body)
            except BaseException as e:
                err = _status(e)
                self._send(err.code, {"error": {"message": str(err), "type": err.kind, "code": err.code}})  # fmt: skip

        do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _answer

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("iceberg rest: " + format, *args)

    return Handler


class RestServer:
    """The HTTP server in a thread of the gateway process."""

    def __init__(self, rest: RestCatalog, host: str, port: int) -> None:
        self.http = ThreadingHTTPServer((host, port), _handler(rest))
        self.thread = threading.Thread(
            target=self.http.serve_forever, daemon=True, name="iceberg-rest"
        )
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.http.server_address[1])

    def shutdown(self) -> None:
        self.http.shutdown()
        self.http.server_close()
