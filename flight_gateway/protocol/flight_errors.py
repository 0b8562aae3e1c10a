"""Harness errors <-> Flight errors.

pyarrow's Python Flight server can emit INVALID_ARGUMENT, NOT_FOUND, UNAUTHENTICATED,
PERMISSION_DENIED, UNAVAILABLE, UNIMPLEMENTED and INTERNAL, but no Arrow status maps to gRPC
FAILED_PRECONDITION or ALREADY_EXISTS. Those travel as FlightServerError (gRPC UNKNOWN) whose
message starts with ``[FAILED_PRECONDITION]`` / ``[ALREADY_EXISTS]`` and whose ``extra_info`` is
``{"code": ...}``; the Python client turns them back into typed errors.

GetSchema is worse off: pyarrow's server callback for it does not translate Flight errors at
all (apache/arrow#43556), so every status but INVALID_ARGUMENT and NOT_FOUND would arrive as a
bare UNKNOWN. Its errors travel the same way (``prefixed``), and the client's GetSchema, which
raises a plain ``ArrowException`` for them, reads the prefix too.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.flight as fl

from flight_gateway.protocol import errors as E

_BY_STATUS: dict[str, type[E.HarnessError]] = {
    "INVALID_ARGUMENT": E.InvalidArgument,
    "NOT_FOUND": E.NotFound,
    "ALREADY_EXISTS": E.AlreadyExists,
    "FAILED_PRECONDITION": E.Conflict,
    "UNAUTHENTICATED": E.Unauthenticated,
    "UNAUTHORIZED": E.Unauthorized,
    "UNAVAILABLE": E.Unavailable,
    "RESOURCE_EXHAUSTED": E.ResourceExhausted,
    "DEADLINE_EXCEEDED": E.TimedOut,
    "CANCELLED": E.Cancelled,
}


#: Statuses with a Flight error of their own (the rest travel as a prefixed FlightServerError).
_TYPED: dict[str, type[fl.FlightError]] = {
    "UNAUTHENTICATED": fl.FlightUnauthenticatedError,
    "UNAUTHORIZED": fl.FlightUnauthorizedError,
    "UNAVAILABLE": fl.FlightUnavailableError,
    "DEADLINE_EXCEEDED": fl.FlightTimedOutError,
    "CANCELLED": fl.FlightCancelledError,
}


#: Flight status names as pyarrow writes them after ". Detail: " in an error it raises untyped.
_DETAILS: dict[str, type[E.HarnessError]] = {
    "Unauthenticated": E.Unauthenticated,
    "Unauthorized": E.Unauthorized,
    "Unavailable": E.Unavailable,
    "TimedOut": E.TimedOut,
    "Cancelled": E.Cancelled,
}


def to_flight_error(err: E.HarnessError, prefixed: bool = False) -> Exception:
    """The Flight error ``err`` travels as; ``prefixed``: every status but INVALID_ARGUMENT and
    NOT_FOUND as a message prefix (for GetSchema, module docstring)."""
    msg = str(err)
    if isinstance(err, E.InvalidArgument):
        return pa.ArrowInvalid(msg)
    if isinstance(err, E.NotFound):
        return pa.ArrowKeyError(msg)
    typed = None if prefixed else _TYPED.get(type(err).status)
    if typed is not None:
        return typed(msg)
    kind = (
        "lock_expired"
        if isinstance(err, E.LockExpired)
        else "lock_unavailable"
        if isinstance(err, E.LockUnavailable)
        else "busy"
        if isinstance(err, E.Busy)
        else ""
    )
    info = json.dumps({"code": err.status, "kind": kind}).encode()
    return fl.FlightServerError(f"[{err.status}] {msg}", info)


def is_busy(exc: BaseException) -> bool:
    """A refusal by a concurrency limit (``errors.Busy``): the call did nothing yet."""
    if isinstance(exc, E.Busy):
        return True
    info = getattr(exc, "extra_info", None)
    return isinstance(exc, fl.FlightServerError) and b'"kind": "busy"' in bytes(info or b"")


def _clean(msg: str) -> str:
    # pyarrow appends ". Detail: Python exception: ..." / gRPC details to server messages.
    for marker in (". Detail: ", ". gRPC client debug context"):
        if marker in msg:
            msg = msg.split(marker)[0]
    return msg


def from_flight_error(exc: Exception) -> Exception:
    """The typed harness error a Flight error stands for (or ``exc`` itself)."""
    msg = _clean(str(exc))
    server = isinstance(exc, fl.FlightServerError)
    # GetSchema's untyped error (module docstring): the prefix right at the start, never one
    # quoted inside an INVALID_ARGUMENT or NOT_FOUND message (a caller's own text).
    untyped = not isinstance(exc, (fl.FlightError, pa.ArrowInvalid, pa.ArrowKeyError))
    if server or untyped:
        head = msg.removeprefix("Unknown error: ")
        for status, cls in _BY_STATUS.items():
            prefix = f"[{status}] "
            if (prefix in msg) if server else head.startswith(prefix):
                text = msg.split(prefix, 1)[1]
                if status == "RESOURCE_EXHAUSTED" and is_busy(exc):
                    return E.Busy(text)
                if status == "FAILED_PRECONDITION":
                    if "lock_expired" in str(getattr(exc, "extra_info", b"")):
                        return E.LockExpired(text)
                    if "lock_unavailable" in str(getattr(exc, "extra_info", b"")):
                        return E.LockUnavailable(text)
                return cls(text)
    if untyped:  # GetSchema's client raises the Flight status as text
        detail = str(exc).partition(". Detail: ")[2].partition(".")[0]
        if detail in _DETAILS:
            return _DETAILS[detail](msg)
    if isinstance(exc, fl.FlightUnauthenticatedError):
        return E.Unauthenticated(msg)
    if isinstance(exc, fl.FlightUnauthorizedError):
        return E.Unauthorized(msg)
    if isinstance(exc, fl.FlightUnavailableError):
        return E.Unavailable(msg)
    if isinstance(exc, fl.FlightTimedOutError):
        return E.TimedOut(msg)
    if isinstance(exc, fl.FlightCancelledError):
        return E.Cancelled(msg)
    if isinstance(exc, pa.ArrowInvalid):
        return E.InvalidArgument(msg)
    if isinstance(exc, (pa.ArrowKeyError, KeyError)):
        return E.NotFound(msg.strip("'\""))
    return exc
