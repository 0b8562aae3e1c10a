"""Who is calling, as Flight middleware: the bearer token is checked when the call starts (a
bad one fails it at once); the client certificate and anonymous access are resolved when a
handler asks (``principal_of``). The rules are the core's (``TokenStore``), the same as the
other faces'."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import pyarrow.flight as fl

from flight_gateway.core.auth import Principal, TokenStore
from flight_gateway.protocol.errors import HarnessError, Unauthenticated

log = logging.getLogger(__name__)


class AuthMiddleware(fl.ServerMiddleware):
    def __init__(self, principal: Principal | None, store: TokenStore) -> None:
        #: None: no bearer token; the caller may still present a client certificate.
        self.principal = principal
        self.store = store


class BearerAuthFactory(fl.ServerMiddlewareFactory):
    def __init__(self, store: TokenStore) -> None:
        self.store = store

    def start_call(self, info: fl.CallInfo, headers: Mapping[str, Sequence[str]]) -> AuthMiddleware:
        values = headers.get("authorization") or headers.get("Authorization") or []
        try:
            principal = self.store.bearer(values[0] if values else None)
        except HarnessError as e:
            raise fl.FlightUnauthenticatedError(str(e)) from None
        except Exception:  # a bug: INTERNAL as a Flight error (no traceback to the caller)
            log.exception("checking a call's bearer token failed")
            raise fl.FlightInternalError("internal error checking the bearer token") from None
        if principal is None and not (self.store.allow_anonymous or self.store.certs):
            raise fl.FlightUnauthenticatedError("missing 'authorization: Bearer <token>' header")
        return AuthMiddleware(principal, self.store)


def principal_of(context: fl.ServerCallContext) -> Principal:
    """The caller of a Flight call (``TokenStore.caller``)."""
    mw = context.get_middleware("auth")
    if mw is None:
        raise Unauthenticated("no credentials")
    identity = context.peer_identity()
    subject = identity.decode() if isinstance(identity, bytes) else str(identity or "")
    store: TokenStore = mw.store
    return store.caller(mw.principal, subject)


class HandshakeAuth(fl.ServerAuthHandler):
    """Answers Flight's Handshake, which some clients make before anything else (the Arrow
    Flight SQL JDBC driver does with ``token=``): the call's bearer token is checked by the
    middleware like every call's, so the handshake itself exchanges nothing and every call's
    identity stays the middleware's. Not installed when client certificates name principals:
    with an auth handler, Flight takes the peer identity from it instead of from the TLS
    certificate (there, JDBC clients authenticate with their certificate)."""

    def authenticate(self, outgoing: fl.ServerAuthSender, incoming: fl.ServerAuthReader) -> None:
        return None

    def is_valid(self, token: bytes) -> bytes:
        return b""
