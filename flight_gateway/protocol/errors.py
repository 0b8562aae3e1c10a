"""Typed errors shared by every layer.

Each error names what went wrong and where (table, source, lock). The server maps them to
Flight status codes (see ``flight_gateway.app``); nothing here imports pyarrow.flight, so
the catalog and the planners can raise them without knowing about the wire.
"""

from __future__ import annotations

import re


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


class TimedOut(HarnessError):
    """A call ran past a configured time limit (an SQL statement's ``limits.sql_timeout_s``)."""

    status = "DEADLINE_EXCEEDED"


class Cancelled(HarnessError):
    """The caller cancelled the call (``CancelFlightInfo``, Flight SQL's ``CancelQuery``)."""

    status = "CANCELLED"


class ResourceExhausted(HarnessError):
    """A limit was reached: a request too large, or too many calls at once (``Busy``)."""

    status = "RESOURCE_EXHAUSTED"


class Busy(ResourceExhausted):
    """Every slot of a concurrency limit is taken: the call was refused before it did anything,
    so the same call succeeds later (the Python client waits and retries it)."""


_CONTENT = [
    # CSV: "Row #3: Expected 2 columns, got 1: <the line>"
    (re.compile(r"(Expected \d+ columns?, got \d+)\s*:.*", re.DOTALL), r"\1"),
    # CSV/JSON conversions: "invalid value 'abc'", "Invalid value: xyz"
    (re.compile(r"(invalid value)\s*('[^']*'|\"[^\"]*\"|:\s*\S.*)", re.IGNORECASE), r"\1"),
    # Casts: "Failed to parse string: 'abc' as a scalar of type int64"
    (re.compile(r"(string)\s*:\s*'[^']*'", re.IGNORECASE), r"\1"),
    # Parsers quoting the text they stopped at: "... near 'text'", "... at: text"
    (
        re.compile(r"(\b(?:near|at|got|found|token)\b)\s*'[^']*'", re.IGNORECASE),
        r"\1 (text withheld)",
    ),
]


def without_content(message: str) -> str:
    """A reader's error message with any quoted file content removed: the position and the
    reason stay (``Row #3: Expected 2 columns, got 1``), the offending line or value goes. Used
    for every error a source reader raises, so a file the caller should not see cannot be read
    back through error messages."""
    for pattern, repl in _CONTENT:
        message = pattern.sub(repl, message)
    return message
