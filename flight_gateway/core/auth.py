"""Who is calling and what they may do: bearer tokens or client certificates, checked on every
call (DoGet included), and per-table permissions.

Permissions are table-name patterns (``fnmatch``) at three levels, each implying the ones below:
``admin`` (create/drop tables, add/remove sources, schema changes, properties, retention),
``write`` (commit states of existing sources, DoPut, engine writes, locks) and ``read`` (plan,
DoGet, describe, history). A token or certificate spec grants nothing it does not list, and
needs a ``name`` of its own: its principal, to which tickets, handles, locks and stream slots
belong. Anonymous calls are accepted only with ``allow_anonymous``: fully open when no tokens
are configured (local development), otherwise limited to the ``anonymous`` grants of the config.
"""

from __future__ import annotations

import fnmatch
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flight_gateway.core import metrics
from flight_gateway.protocol.errors import Unauthenticated, Unauthorized

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
    def from_spec(cls, name: str, spec: Mapping[str, Any] | None, where: str = "") -> Principal:
        """The principal of a grants spec: its ``name`` (``name`` when the spec has none)."""
        spec = spec or {}
        unknown = sorted(set(spec) - {"name", *LEVELS})
        if unknown:
            raise ValueError(f"unknown keys {unknown} in the grants of {where or repr(name)}")
        return cls(
            str(spec.get("name", name)),
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


def _named(spec: Any, where: str, reserved: str) -> Principal:
    """A token's or certificate's principal: it must be named (tickets, statement handles,
    locks and stream slots belong to the name)."""
    name = spec.get("name") if isinstance(spec, Mapping) else None
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where} needs a non-empty 'name' (the principal it authenticates)")
    if name == reserved:
        raise ValueError(f"{where}: the name {name!r} is the anonymous callers' principal")
    return Principal.from_spec(name, spec, where)


def named_principals(
    tokens: Mapping[str, Any], certs: Mapping[str, Any], anonymous: str = OPEN.name
) -> tuple[dict[str, Principal], dict[str, Principal]]:
    """Principals by token and by certificate subject; every name unique across both and not
    the anonymous principal's (tokens are secrets: errors name a token by its position)."""
    by_token = {
        t: _named(spec, f"token #{i + 1}", anonymous) for i, (t, spec) in enumerate(tokens.items())
    }
    by_cert = {s: _named(spec, f"certificate {s!r}", anonymous) for s, spec in certs.items()}
    names = [p.name for p in [*by_token.values(), *by_cert.values()]]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(
            f"principal name(s) {dupes} given to more than one token or certificate: each "
            "needs its own name (tickets, handles, locks and stream slots are per name)"
        )
    return by_token, by_cert


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
        empty = [t for t in tokens if not str(t).strip()]
        if empty:  # ``${NAME}`` of a variable set but empty would accept "Bearer " from anyone
            raise ValueError("tokens: an empty token is not a credential (an unset variable?)")
        # With no credentials configured at all (local development) anonymous is open.
        anon = Principal.from_spec("anonymous", anonymous) if tokens or certs else OPEN
        principals, by_cert = named_principals(tokens, certs or {}, anon.name)
        return cls(principals, allow_anonymous, anon, by_cert)

    def lookup(self, token: str) -> Principal | None:
        if not token:
            return None
        found = None
        for known, principal in self.tokens.items():
            # Compare against every token, each in constant time.
            if hmac.compare_digest(known.encode(), token.encode()):
                found = principal
        return found

    def by_certificate(self, subject: str) -> Principal | None:
        return self.certs.get(subject)

    def bearer(self, header: str | None) -> Principal | None:
        """The principal of an ``Authorization`` header, the same rules on every face: None
        when there is no token (no header, ``Bearer `` or pyiceberg's ``Bearer None``);
        UNAUTHENTICATED for any other scheme or an unknown token."""
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer":
            raise refused("authorization header must be 'Bearer <token>'")
        if token in ("", "None"):
            return None
        found = self.lookup(token)
        if found is None:
            raise refused("invalid bearer token")
        return found

    def caller(self, bearer: Principal | None, certificate_subject: str = "") -> Principal:
        """The caller: its bearer token's principal, else its client certificate's, else
        anonymous (when allowed)."""
        if bearer is not None:
            return bearer
        by_cert = self.by_certificate(certificate_subject) if certificate_subject else None
        if by_cert is not None:
            return by_cert
        if self.allow_anonymous:
            return self.anonymous
        raise refused("no bearer token and no known client certificate")


def refused(reason: str) -> Unauthenticated:
    metrics.AUTH_FAILURES.inc()
    return Unauthenticated(reason)
