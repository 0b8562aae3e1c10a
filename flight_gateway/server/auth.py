"""Who is calling and what they may do: bearer tokens or client certificates, checked on every
call (DoGet included), and per-table permissions.

Permissions are table-name patterns (``fnmatch``) at three levels, each implying the ones below:
``admin`` (create/drop tables, add/remove sources, schema changes, properties, retention),
``write`` (commit states of existing sources, DoPut, engine writes, locks) and ``read`` (plan,
DoGet, describe, history). A token or certificate spec grants nothing it does not list.
Anonymous calls are accepted only with ``allow_anonymous``: fully open when no tokens are
configured (local development), otherwise limited to the ``anonymous`` grants of the config.
"""

from __future__ import annotations

import fnmatch
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.flight as fl

from flight_gateway.errors import Unauthenticated, Unauthorized
from flight_gateway.server import metrics

LEVELS = ("read", "write", "admin")


def _patterns(spec: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = spec.get(key, ())
    if isinstance(value, str) or not all(isinstance(p, str) for p in value):
        raise ValueError(f"permission {key!r} must be a list of table patterns")
    return tuple(value)


@dataclass(frozen=True)
class Principal:
    name: str
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    admin: tuple[str, ...] = ()

    @classmethod
    def from_spec(cls, default_name: str, spec: Mapping[str, Any] | None) -> Principal:
        spec = spec or {}
        unknown = sorted(set(spec) - {"name", *LEVELS})
        if unknown:
            raise ValueError(f"unknown keys {unknown} in the grants of {default_name!r}")
        return cls(
            str(spec.get("name", default_name)),
            _patterns(spec, "read"),
            _patterns(spec, "write"),
            _patterns(spec, "admin"),
        )

    def can(self, level: str, table: str) -> bool:
        granted = {"read": self.read + self.write + self.admin, "write": self.write + self.admin}
        patterns = granted.get(level, self.admin)
        return any(fnmatch.fnmatchcase(table, p) for p in patterns)

    def require(self, level: str, table: str) -> None:
        if not self.can(level, table):
            raise Unauthorized(f"{self.name!r} may not {level} table {table!r}")


OPEN = Principal("anonymous", ("*",), ("*",), ("*",))


@dataclass
class TokenStore:
    tokens: Mapping[str, Principal] = field(default_factory=dict)
    allow_anonymous: bool = False
    anonymous: Principal = field(default_factory=lambda: Principal("anonymous"))
    #: certificate subject -> principal (mutual TLS)
    certs: Mapping[str, Principal] = field(default_factory=dict)

    @classmethod
    def from_config(
        cls,
        tokens: Mapping[str, Any],
        allow_anonymous: bool,
        anonymous: Mapping[str, Any] | None = None,
        certs: Mapping[str, Any] | None = None,
    ) -> TokenStore:
        principals = {t: Principal.from_spec("user", spec) for t, spec in tokens.items()}
        by_cert = {s: Principal.from_spec(s, spec) for s, spec in (certs or {}).items()}
        # With no credentials configured at all (local development) anonymous is open.
        anon = Principal.from_spec("anonymous", anonymous) if tokens or by_cert else OPEN
        return cls(principals, allow_anonymous, anon, by_cert)

    def lookup(self, token: str) -> Principal | None:
        found = None
        for known, principal in self.tokens.items():
            # Compare against every token, each in constant time.
            if hmac.compare_digest(known.encode(), token.encode()):
                found = principal
        return found

    def by_certificate(self, subject: str) -> Principal | None:
        return self.certs.get(subject)


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
        if not values:
            if self.store.allow_anonymous or self.store.certs:
                return AuthMiddleware(None, self.store)
            raise _refused("missing 'authorization: Bearer <token>' header")
        scheme, _, token = values[0].partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise _refused("authorization header must be 'Bearer <token>'")
        principal = self.store.lookup(token.strip())
        if principal is None:
            raise _refused("invalid bearer token")
        return AuthMiddleware(principal, self.store)


def _refused(reason: str) -> fl.FlightUnauthenticatedError:
    metrics.AUTH_FAILURES.inc()
    return fl.FlightUnauthenticatedError(reason)


def principal_of(context: fl.ServerCallContext) -> Principal:
    """The caller: its bearer token's principal, else its client certificate's, else anonymous
    (when allowed)."""
    mw = context.get_middleware("auth")
    if mw is None:
        raise Unauthenticated("no credentials")
    if mw.principal is not None:
        return mw.principal
    store: TokenStore = mw.store
    identity = context.peer_identity()
    subject = identity.decode() if isinstance(identity, bytes) else str(identity or "")
    by_cert = store.by_certificate(subject) if subject else None
    if by_cert is not None:
        return by_cert
    if store.allow_anonymous:
        return store.anonymous
    raise Unauthenticated("no bearer token and no known client certificate")
