"""Errors on the wire: harness errors mapped to Flight status codes, secrets scrubbed, and
streams that fail loudly instead of ending early looking complete."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
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
#: from a handler's frame, that showed the gateway's install path and source line to every
#: caller. The frames that raise to pyarrow carry a file name that is no file, so the traceback
#: shows neither; what they raise is made fresh, so no other frame comes with it.
_NEUTRAL_FILE = "<harness-gateway>"


def _neutral(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn.__code__ = fn.__code__.replace(co_filename=_NEUTRAL_FILE)
    return fn


def flight_errors(fn: F) -> F:
    """Map harness errors to Flight status codes; never let an unexpected error kill a call
    without a clear message (the server itself keeps serving either way). No message carries a
    resolved secret, and no traceback a server path (``_NEUTRAL_FILE``)."""

    @functools.wraps(fn)
    @_neutral
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        call = args[1] if len(args) > 1 and isinstance(args[1], fl.ServerCallContext) else None
        try:
            with activate(call) if call is not None else contextlib.nullcontext():
                out = fn(*args, **kwargs)
        except BaseException as e:
            metrics.observe_rpc(fn.__name__, started, e)
            # "from None": a chained traceback can outgrow gRPC's metadata limit (the client
            # sees RESOURCE_EXHAUSTED).
            raise _on_the_wire(fn.__name__, e).with_traceback(None) from None
        metrics.observe_rpc(fn.__name__, started, None)
        return out

    return wrapper  # type: ignore[return-value]


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

    return pa.RecordBatchReader.from_batches(reader.schema, _sent(first, reader, on_close))


@_neutral
def _sent(
    first: pa.RecordBatch | None,
    reader: pa.RecordBatchReader,
    on_close: Callable[[], None] | None,
) -> Iterator[pa.RecordBatch]:
    """``first`` and the rest of ``reader`` in wire-sized pieces; a failure raised as its wire
    error from this frame (``_NEUTRAL_FILE``)."""
    try:
        if first is not None:
            yield from wire_sized(first)
            for batch in reader:
                yield from wire_sized(batch)
    except HarnessError as e:
        raise _wire(e, "do_get").with_traceback(None) from None
    except pa.ArrowException as e:  # a reader failing mid-stream (bad CSV row, ...)
        raise type(e)(_clean(str(e))) from None
    except Exception as e:  # a bug: INTERNAL, logged
        raise _on_the_wire("do_get", e).with_traceback(None) from None
    finally:
        if on_close is not None:
            on_close()


def _first_batch(reader: pa.RecordBatchReader) -> pa.RecordBatch | None:
    try:
        return reader.read_next_batch()
    except StopIteration:
        return None
    except pa.ArrowException as e:
        raise type(e)(_clean(str(e))) from None
