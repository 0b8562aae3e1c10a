"""One server span per Flight call (ended when the call completes, a DoGet stream included);
handlers make it current with ``activate`` (middleware hooks run in another context than the
handler, so they cannot). Off, and free, unless the core's tracing is configured."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow.flight as fl

from flight_gateway.core import tracing

log = logging.getLogger(__name__)


class _TraceMiddleware(fl.ServerMiddleware):
    def __init__(self, server_span: Any) -> None:
        self.span = server_span

    def call_completed(self, exception: BaseException | None) -> None:
        if exception is not None:
            self.span.record_exception(exception)
        self.span.end()


class TraceFactory(fl.ServerMiddlewareFactory):
    def start_call(
        self, info: fl.CallInfo, headers: Mapping[str, Sequence[Any]]
    ) -> fl.ServerMiddleware | None:
        method = str(info.method).rsplit(".", 1)[-1]
        try:
            span = tracing.server_span(f"flight.{method}", headers)
        except Exception:  # tracing never fails a call (a header it could not read)
            log.warning("flight.%s: no trace span", method, exc_info=True)
            return None
        return None if span is None else _TraceMiddleware(span)


@contextmanager
def activate(call: fl.ServerCallContext) -> Iterator[None]:
    mw = call.get_middleware("trace") if tracing.enabled() else None
    with tracing.current(None if mw is None else mw.span):
        yield
