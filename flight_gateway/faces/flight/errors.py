"""Errors on the wire: harness errors mapped to Flight status codes, secrets scrubbed, and
streams that fail loudly instead of ending early looking complete."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as fl
from sqlalchemy.exc import OperationalError

from flight_gateway.core import metrics
from flight_gateway.core.secrets import scrub
from flight_gateway.faces.flight.tracing import activate
from flight_gateway.protocol.errors import (
    HarnessError,
    InvalidArgument,
    Unavailable,
    without_content,
)
from flight_gateway.protocol.flight_errors import to_flight_error

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


#: The longest error message sent, in UTF-8 bytes. A message repeats what the caller sent (a
#: table name, an owner, a value); gRPC carries it percent-encoded (a non-ASCII byte takes
#: three) in a trailer of at most 16 KiB, and pyarrow repeats it in the status detail: past
#: that the client gets RESOURCE_EXHAUSTED instead of the error's own status.
MAX_MESSAGE_BYTES = 1000


def _clean(text: str) -> str:
    """No secret value and no file content in anything sent to a caller; at most
    ``MAX_MESSAGE_BYTES`` of UTF-8 (cut at a character)."""
    text = without_content(scrub(text))
    data = text.encode("utf-8", "replace")
    if len(data) > MAX_MESSAGE_BYTES:
        cut = data[:MAX_MESSAGE_BYTES].decode("utf-8", "ignore")
        text = f"{cut}... ({len(text)} characters in all)"
    return text


def _wire(e: HarnessError, method: str) -> Exception:
    # GetSchema's errors carry their status in the message (protocol.flight_errors).
    return to_flight_error(type(e)(_clean(str(e))), prefixed=method == "get_schema")


def _on_the_wire(method: str, e: BaseException) -> BaseException:
    """The exception a handler's failure becomes on the wire."""
    if isinstance(e, HarnessError):
        log.info("%s: %s: %s", method, type(e).__name__, scrub(str(e)))
        return _wire(e, method)
    if isinstance(e, OperationalError):
        log.warning("%s: catalog unavailable: %s", method, scrub(str(e)))
        return _wire(Unavailable("harness catalog unavailable"), method)
    if isinstance(e, NotImplementedError):
        return NotImplementedError(_clean(str(e)))
    if isinstance(e, fl.FlightError) or not isinstance(e, Exception):
        return e
    if isinstance(e, pa.ArrowException):
        return type(e)(_clean(str(e)))
    if isinstance(e, RecursionError):  # deeply nested JSON or filters: the caller's doing
        return _wire(InvalidArgument("request is nested too deeply"), method)
    log.error("%s failed", method, exc_info=e)
    return fl.FlightInternalError(f"internal error: {type(e).__name__}: {_clean(str(e))}")


#: Where errors are raised to pyarrow from. pyarrow's server sends the Python traceback of an
#: error that is not a Flight error (INVALID_ARGUMENT and NOT_FOUND on every method, every
#: status of GetSchema, apache/arrow#43556, an error mid-stream) in the status detail: raised
#: from the handler's own frame, that showed the gateway's install path and source line to
#: every caller. The two frames below carry a file name that is no file, so the traceback shows
#: neither; the errors they raise are made fresh (``_on_the_wire``), so no frame comes with them.
_NEUTRAL_FILE = "<harness-gateway>"


def _neutral(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn.__code__ = fn.__code__.replace(co_filename=_NEUTRAL_FILE)
    return fn


def _handler_of(attempt: Callable[..., tuple[bool, Any]]) -> Callable[..., Any]:
    @_neutral
    def handler(*args: Any, **kwargs: Any) -> Any:
        ok, value = attempt(*args, **kwargs)
        if ok:
            return value
        raise value.with_traceback(None) from None

    return handler


@_neutral
def _stream_of(
    step: Callable[[], tuple[int, Any]], close: Callable[[], None]
) -> Iterator[pa.RecordBatch]:
    try:
        while True:
            state, value = step()
            if state == 1:
                yield value
            elif state == 0:
                return
            else:
                raise value.with_traceback(None) from None
    finally:
        close()  # the source's own end (its ``on_close``) when abandoned early too


def flight_errors(fn: F) -> F:
    """Map harness errors to Flight status codes; never let an unexpected error kill a call
    without a clear message (the server itself keeps serving either way). No message carries a
    resolved secret, and no traceback a server path (``_NEUTRAL_FILE``)."""

    def attempt(*args: Any, **kwargs: Any) -> tuple[bool, Any]:
        started = time.perf_counter()
        call = args[1] if len(args) > 1 and isinstance(args[1], fl.ServerCallContext) else None
        try:
            with activate(call) if call is not None else contextlib.nullcontext():
                out = fn(*args, **kwargs)
        except BaseException as e:
            metrics.observe_rpc(fn.__name__, started, e)
            # Raised "from None": a chained traceback can outgrow gRPC's metadata limit (the
            # client sees RESOURCE_EXHAUSTED).
            return False, _on_the_wire(fn.__name__, e)
        metrics.observe_rpc(fn.__name__, started, None)
        return True, out

    return functools.wraps(fn)(_handler_of(attempt))  # type: ignore[return-value]


#: Batches go out as IPC messages of at most about this many body bytes. The Flight client
#: takes a message body in place, right after its protobuf length prefix, a varint: measured
#: with pyarrow 26, bodies of 16 KiB to 2 MiB - 1 (3-byte prefix) arrive 8-byte aligned, larger
#: ones (a 64K-row batch of four 8-byte columns is exactly 2 MiB; 4-byte prefix) at 1 mod 8,
#: and the client's IPC reader then copies every buffer again to realign it (Acero needs it).
#: Slicing is zero-copy and the IPC writer sends only the slice. 1 MiB was faster than 256 KiB
#: or 512 KiB (16 M rows over loopback, docs/operations.md).
WIRE_BATCH_BYTES = 1 << 20


def wire_sized(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    """``batch`` as zero-copy slices of about ``WIRE_BATCH_BYTES`` each (itself when smaller)."""
    nbytes = batch.nbytes
    if nbytes <= WIRE_BATCH_BYTES + (WIRE_BATCH_BYTES >> 1) or batch.num_rows < 2:
        yield batch
        return
    # at least 1024 rows a piece: a large dictionary counts in every slice's nbytes
    pieces = min(max(1, batch.num_rows // 1024), -(-nbytes // WIRE_BATCH_BYTES))
    step = -(-batch.num_rows // pieces)
    for start in range(0, batch.num_rows, step):
        yield batch.slice(start, step)


def stream_errors(
    reader: pa.RecordBatchReader, on_close: Callable[[], None] | None = None
) -> pa.RecordBatchReader:
    """Errors raised while streaming still reach the client as a failed stream with a clear
    message, never as a stream that ends early looking complete. ``on_close`` runs when the
    stream ends, fails or is abandoned.

    The first batch is read here, before the stream is returned: an error before any row (a
    source busy, say) fails the call itself with its status details, which pyarrow drops from
    errors raised mid-stream (so a client could not tell that a retry is safe)."""
    try:
        first = _first_batch(reader)
    except BaseException:
        if on_close is not None:
            on_close()
        raise

    def gen() -> Generator[pa.RecordBatch, None, None]:
        try:
            if first is not None:
                yield from wire_sized(first)
                for batch in reader:
                    yield from wire_sized(batch)
        finally:
            if on_close is not None:
                on_close()

    batches = gen()
    return pa.RecordBatchReader.from_batches(
        reader.schema, _stream_of(_steps(batches), batches.close)
    )


def _steps(batches: Iterator[pa.RecordBatch]) -> Callable[[], tuple[int, Any]]:
    """``batches`` one step at a time for ``_stream_of``: (1, batch), (0, None) at the end, or
    (2, the error sent) when reading failed (it is raised from the neutral frame)."""

    def step() -> tuple[int, Any]:
        try:
            return 1, next(batches)
        except StopIteration:
            return 0, None
        except HarnessError as e:
            return 2, _wire(e, "do_get")
        except pa.ArrowException as e:  # a reader failing mid-stream (bad CSV row, ...)
            return 2, type(e)(_clean(str(e)))
        except Exception as e:  # a bug: INTERNAL, logged
            return 2, _on_the_wire("do_get", e)

    return step


def _first_batch(reader: pa.RecordBatchReader) -> pa.RecordBatch | None:
    try:
        return reader.read_next_batch()
    except StopIteration:
        return None
    except pa.ArrowException as e:
        raise type(e)(_clean(str(e))) from None
