"""The Iceberg REST catalog's routes (read side), independent of the HTTP server.

``GET /v1/config``; one namespace, ``harness``; tables listed per the caller's read permission;
``loadTable`` returns metadata whose current snapshot is the pinned harness version (the latest,
or ``?version=N``) over its layout: cold files where they are, hot slices made once
(``flight_gateway.core.layout``). Every write is refused: writes go through DoPut and DoAction.
Callers are identified by the same rules as on Flight (bearer tokens, client certificates,
anonymous only when allowed); errors follow the spec's error model, scrubbed of secrets and
file content like Flight's.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from flight_gateway.catalog import TableSnapshot
from flight_gateway.core.auth import Principal, TokenStore
from flight_gateway.core.layout import Layouts, SliceStore, VersionLayout
from flight_gateway.core.read import ReadService
from flight_gateway.core.secrets import scrub
from flight_gateway.core.slots import Slots
from flight_gateway.faces.iceberg_rest.metadata import MetadataWriter
from flight_gateway.protocol.errors import (
    Cancelled,
    HarnessError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    TimedOut,
    Unauthenticated,
    Unauthorized,
    Unavailable,
    without_content,
)
from flight_gateway.protocol.messages import MAX_INT64

log = logging.getLogger(__name__)
NAMESPACE = "harness"
#: The routes this catalog serves (``/v1/config`` advertises them: Iceberg clients >= 1.7 call
#: nothing else).
ENDPOINTS = [
    "GET /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
]

#: The methods this catalog answers on each of its routes (HEAD wherever GET is): the
#: ``Allow`` header of a 405.
ALLOWED = ("GET", "HEAD")
#: The spec's writes on the routes this catalog serves: refused as writes (403, read-only),
#: not as methods the route lacks (405).
_SPEC_WRITES = {
    "config": frozenset(),
    "namespaces": frozenset({"POST"}),
    "namespace": frozenset({"DELETE"}),
    "tables": frozenset({"POST"}),
    "table": frozenset({"POST", "DELETE"}),
}
#: On any other path: the spec's other routes (rename, register, commit, ...) are writes.
_OTHER_WRITES = frozenset({"POST", "PUT", "DELETE"})


class RestError(Exception):
    def __init__(self, code: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.code, self.kind = code, kind


def error_body(e: BaseException) -> tuple[int, dict[str, Any]]:
    """The spec's ``ErrorModel`` for ``e``: a status a caller can act on, never INTERNAL for
    something it did, no secret and no file content in the message."""
    if isinstance(e, RestError):
        err = e
    elif isinstance(e, Unauthenticated):
        err = RestError(401, "NotAuthorizedException", str(e))
    elif isinstance(e, Unauthorized):
        err = RestError(403, "ForbiddenException", str(e))
    elif isinstance(e, NotFound):
        err = RestError(404, "NoSuchTableException", str(e))
    elif isinstance(e, ResourceExhausted):
        err = RestError(503, "SlowDownException", str(e))
    elif isinstance(e, Unavailable | TimedOut | Cancelled):  # the gateway's side, not the caller's
        err = RestError(503, "ServiceUnavailableException", str(e))
    elif isinstance(e, HarnessError):
        err = RestError(400, "BadRequestException", str(e))
    else:
        log.error("iceberg rest: internal error", exc_info=e)
        err = RestError(500, "ServiceFailureException", f"internal error: {type(e).__name__}")
    message = without_content(scrub(str(err)))
    return err.code, {"error": {"message": message, "type": err.kind, "code": err.code}}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: Mapping[str, list[str]]
    authorization: str | None
    certificate_subject: str = ""


class RestCatalog:
    def __init__(
        self,
        reads: ReadService,
        tokens: TokenStore,
        layouts: Layouts,
        writer: MetadataWriter,
        loads: Slots,
        answering: Slots | None = None,
    ) -> None:
        self.reads, self.tokens, self.layouts, self.writer, self.loads = (
            reads, tokens, layouts, writer, loads,
        )  # fmt: skip
        #: Requests of each principal being answered (``max_requests_per_principal``).
        self.answering = answering or Slots(8, "iceberg_rest.max_requests_per_principal",
                                            what="requests being answered")  # fmt: skip
        self.store: SliceStore = layouts.store
        self._layouts: OrderedDict[tuple[int, int], VersionLayout] = OrderedDict()
        self._lock = threading.Lock()

    def principal(self, req: Request) -> Principal:
        """The caller, by the same rules as every face (``TokenStore``)."""
        return self.tokens.caller(self.tokens.bearer(req.authorization), req.certificate_subject)

    def admit(self, req: Request) -> Principal | tuple[int, dict[str, Any] | None]:
        """The caller, or the answer to a request refused before it takes a place among its
        principal's requests (``answering``; the server waits for one on its event loop, then
        calls ``respond``): a token request, an unknown caller, a method no route has. Cheap
        (no catalog, no source)."""
        if req.path.rstrip("/").endswith("/oauth/tokens"):
            # The spec's OAuth error shape (a client asking for a token with a credential
            # parses this one, not the error model): this catalog takes bearer tokens only.
            return 400, {
                "error": "unsupported_grant_type",
                "error_description": "this catalog issues no tokens: send the gateway's bearer "
                "token (pyiceberg: token=...)",
            }
        try:
            who = self.principal(req)
            if req.method not in ALLOWED:
                raise _refusal(req.method, _parts(req.path))
            return who
        except Exception as e:  # every failure becomes an error response
            return error_body(e)

    def respond(self, req: Request, who: Principal) -> tuple[int, dict[str, Any] | None]:
        """The answer to an admitted request (the caller holds its place)."""
        try:
            body = self.route(req, who)
            return (204, None) if req.method == "HEAD" else (200, body)
        except Exception as e:  # every failure becomes an error response
            return error_body(e)

    def route(self, req: Request, who: Principal) -> dict[str, Any]:
        parts = _parts(req.path)
        if parts == ["config"]:
            return {"defaults": {}, "overrides": {}, "endpoints": ENDPOINTS}
        if parts == ["namespaces"]:
            return {"namespaces": _children(req.query)}
        if len(parts) < 2 or parts[0] != "namespaces" or parts[1] != NAMESPACE:
            if len(parts) >= 2 and parts[0] == "namespaces":
                raise RestError(404, "NoSuchNamespaceException", f"no namespace {parts[1]!r}")
            raise RestError(404, "NotFoundException", "no such resource")
        if len(parts) == 2:
            return {"namespace": [NAMESPACE], "properties": {}}
        if parts[2:] == ["tables"]:
            names = [t for t in self.reads.catalog.list_tables() if who.can("read", t)]
            return {"identifiers": [{"namespace": [NAMESPACE], "name": t} for t in names]}
        if len(parts) == 4 and parts[2] == "tables":
            return self.load(parts[3], req.query, who)
        raise RestError(404, "NotFoundException", "no such resource")

    # ------------------------------------------------------------------ loadTable

    def load(self, table: str, query: Mapping[str, list[str]], who: Principal) -> dict[str, Any]:
        if not who.can("read", table):  # a table the caller may not read does not exist
            raise RestError(404, "NoSuchTableException", f"no table {NAMESPACE}.{table}")
        version = _version(query)
        for _ in range(3):
            out = self._load(table, version, who)
            if out is not None:
                return out
        raise Unavailable(f"table {table!r}: its versions expired faster than it loaded; retry")

    def _load(self, table: str, version: int | None, who: Principal) -> dict[str, Any] | None:
        """The load of ``version`` (None: the latest); None when the latest expired while it
        was loaded (the caller loads the new latest: a table that exists is never 404)."""
        snap = self.reads.snapshot(table, version)  # dropped, re-created, expired: NOT_FOUND
        with self.store.hold(snap.table_id, snap.version):
            layout = self._layout(snap, who)
            head = self.reads.catalog.head(table)
            if head.table_id != snap.table_id:
                raise NotFound(f"table {table!r} was dropped while it was being loaded")
            kept = range(head.min_version, head.current_version + 1)
            if snap.version not in kept:
                if version is None:
                    return None
                raise NotFound(f"version {snap.version} of {table!r} expired while it was loaded")
            location = f"file://{self.store.root}/t{snap.table_id}"
            metadata, metadata_location = self.writer.metadata(layout, kept, location)
            self.store.pin(snap.table_id, snap.version)  # engines read the files after this
        return {"metadata-location": metadata_location, "metadata": metadata, "config": {}}

    def _layout(self, snap: TableSnapshot, who: Principal) -> VersionLayout:
        key = (snap.table_id, snap.version)
        with self._lock:
            hit = self._layouts.get(key)
            if hit is not None:
                self._layouts.move_to_end(key)
                return hit
        layout = self.layouts.layout(snap, slot=lambda: self.loads.hold(who.name))
        with self._lock:
            self._layouts[key] = layout
            while len(self._layouts) > 256:
                self._layouts.popitem(last=False)
        return layout


def _parts(path: str) -> list[str]:
    """The path's parts after ``/v1`` and an optional prefix."""
    parts = [unquote(p) for p in path.strip("/").split("/")]
    if parts[:1] == ["v1"]:
        parts = parts[1:]
    if parts and parts[0] not in ("config", "namespaces"):
        parts = parts[1:]  # an optional prefix
    return parts


def _resource(parts: list[str]) -> str | None:
    """Which of this catalog's routes ``parts`` is (its resource may not exist), or None."""
    if parts in (["config"], ["namespaces"]):
        return parts[0]
    if len(parts) < 2 or parts[0] != "namespaces":
        return None
    rest = parts[2:]
    if not rest:
        return "namespace"
    if rest == ["tables"]:
        return "tables"
    return "table" if len(rest) == 2 and rest[0] == "tables" else None


def _refusal(method: str, parts: list[str]) -> RestError:
    """A method other than GET and HEAD: a write the spec has there is refused as one (403),
    a method the route does not have is 405 (``Allow``: ``ALLOWED``, set by the server)."""
    kind = _resource(parts)
    if method in (_SPEC_WRITES[kind] if kind is not None else _OTHER_WRITES):
        return RestError(403, "ForbiddenException",
                         "this catalog is read-only: write through the gateway's DoPut and DoAction")  # fmt: skip
    if kind is None:
        return RestError(404, "NotFoundException", "no such resource")
    return RestError(405, "MethodNotAllowedException",
                     f"{method[:20]} is not a method of this resource: it allows "
                     f"{', '.join(ALLOWED)}")  # fmt: skip


def _version(query: Mapping[str, list[str]]) -> int | None:
    given = query.get("version")
    if not given:
        return None
    raw = given[0]
    try:
        version = int(raw)
    except ValueError:
        raise InvalidArgument(f"version must be an integer, not {raw[:40]!r}") from None
    if not 0 <= version <= MAX_INT64:
        raise InvalidArgument("version must be from 0 to 2**63 - 1")
    return version


def _children(query: Mapping[str, list[str]]) -> list[list[str]]:
    """The namespaces under ``?parent=`` (parts joined by 0x1F): the one namespace at the top,
    nothing below it (a client walking the tree stops), NOT_FOUND under any other."""
    given = query.get("parent")
    if not given or not given[0]:
        return [[NAMESPACE]]
    if given[0].split("\x1f") == [NAMESPACE]:
        return []
    raise RestError(404, "NoSuchNamespaceException", f"no namespace {given[0][:80]!r}")
