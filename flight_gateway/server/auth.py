"""Bearer-token authentication (every call, DoGet included) and per-table permissions."""

from __future__ import annotations

import fnmatch
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.flight as fl

from flight_gateway.errors import Unauthorized


@dataclass(frozen=True)
class Principal:
    name: str
    read: tuple[str, ...] = ("*",)  # table name patterns (fnmatch)
    write: tuple[str, ...] = ()

    def can(self, action: str, table: str) -> bool:
        patterns = self.read + self.write if action == "read" else self.write
        return any(fnmatch.fnmatchcase(table, p) for p in patterns)

    def require(self, action: str, table: str) -> None:
        if not self.can(action, table):
            raise Unauthorized(f"{self.name!r} may not {action} table {table!r}")


ANONYMOUS = Principal("anonymous", read=("*",), write=("*",))


@dataclass
class TokenStore:
    tokens: Mapping[str, Principal] = field(default_factory=dict)
    allow_anonymous: bool = False

    @classmethod
    def from_config(cls, tokens: Mapping[str, Any], allow_anonymous: bool) -> TokenStore:
        out = {}
        for token, spec in tokens.items():
            spec = spec or {}
            out[token] = Principal(
                str(spec.get("name", "user")),
                tuple(spec.get("read", ["*"])),
                tuple(spec.get("write", [])),
            )
        return cls(out, allow_anonymous)

    def lookup(self, token: str) -> Principal | None:
        found = None
        for known, principal in self.tokens.items():
            # Compare against every token in constant time per comparison.
            if hmac.compare_digest(known.encode(), token.encode()):
                found = principal
        return found


class AuthMiddleware(fl.ServerMiddleware):
    def __init__(self, principal: Principal) -> None:
        self.principal = principal


class BearerAuthFactory(fl.ServerMiddlewareFactory):
    def __init__(self, store: TokenStore) -> None:
        self.store = store

    def start_call(self, info: fl.CallInfo, headers: Mapping[str, Sequence[str]]) -> AuthMiddleware:
        values = headers.get("authorization") or headers.get("Authorization") or []
        if not values:
            if self.store.allow_anonymous:
                return AuthMiddleware(ANONYMOUS)
            raise fl.FlightUnauthenticatedError("missing 'authorization: Bearer <token>' header")
        scheme, _, token = values[0].partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise fl.FlightUnauthenticatedError("authorization header must be 'Bearer <token>'")
        principal = self.store.lookup(token.strip())
        if principal is None:
            raise fl.FlightUnauthenticatedError("invalid bearer token")
        return AuthMiddleware(principal)


def principal_of(context: fl.ServerCallContext) -> Principal:
    mw = context.get_middleware("auth")
    return mw.principal if mw is not None else ANONYMOUS
