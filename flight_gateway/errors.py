"""Typed errors shared by every layer.

Each error names what went wrong and where (table, source, lock). The server maps them to
Flight status codes (see ``flight_gateway.server``); nothing here imports pyarrow.flight, so
the catalog and the planners can raise them without knowing about the wire.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base class of every error the harness raises on purpose."""

    #: gRPC/Flight status name the server uses for this error.
    status = "INTERNAL"


class InvalidArgument(HarnessError):
    """Bad input: malformed request, unknown column, unsafe schema change, bad filter."""

    status = "INVALID_ARGUMENT"


class NotFound(HarnessError):
    """Unknown table, source, version or lock."""

    status = "NOT_FOUND"


class AlreadyExists(HarnessError):
    """A table or source with that name already exists."""

    status = "ALREADY_EXISTS"


class Conflict(HarnessError):
    """A compare-and-set failed or a source is held by another writer's lock."""

    status = "FAILED_PRECONDITION"


class LockExpired(Conflict):
    """A commit or renewal used a lock that expired, was released or was superseded."""


class LockUnavailable(Conflict):
    """A lock could not be granted within the requested wait."""


class Unauthenticated(HarnessError):
    status = "UNAUTHENTICATED"


class Unauthorized(HarnessError):
    status = "UNAUTHORIZED"


class Unavailable(HarnessError):
    """A source or service the request needs cannot be reached."""

    status = "UNAVAILABLE"


class ResourceExhausted(HarnessError):
    """A per-caller limit was reached (concurrent streams); retry later."""

    status = "RESOURCE_EXHAUSTED"
