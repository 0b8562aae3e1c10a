"""OpenTelemetry tracing, off by default and free when off.

``configure`` (from the gateway config's ``tracing`` section, or a test's exporter) installs a
tracer provider; until then ``span`` is a ``nullcontext`` and nothing is imported. When on:

- every Flight call is a server span (``TraceFactory`` middleware) whose parent is the W3C
  ``traceparent`` header the caller sent (the Python client and the Spark source send theirs);
- the read, write and commit paths open child spans with ``span`` (planning per source, the
  scan of a DoGet, validation, the write per kind, the catalog commit, Flight SQL stages);
- log records carry ``trace_id`` (the JSON log format prints it).

Config: ``tracing = {exporter = "otlp" | "console" | "file", endpoint?, path?}``; ``otlp`` needs
``opentelemetry-exporter-otlp-proto-http`` and falls back to ``console`` without it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow.flight as fl

log = logging.getLogger(__name__)
_tracer: Any = None
TRACEPARENT = "traceparent"


def enabled() -> bool:
    return _tracer is not None


def _exporter(settings: Mapping[str, Any]) -> Any:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    kind = str(settings.get("exporter", "console"))
    if kind == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("tracing: the OTLP exporter is not installed; spans go to the console")
            return ConsoleSpanExporter()
        endpoint = settings.get("endpoint")
        return OTLPSpanExporter(endpoint=str(endpoint)) if endpoint else OTLPSpanExporter()
    if kind == "file":
        out = open(str(settings["path"]), "a")  # noqa: SIM115 - lives as long as the exporter
        return ConsoleSpanExporter(out=out)
    if kind == "console":
        return ConsoleSpanExporter()
    raise ValueError(f"tracing.exporter must be otlp, console or file, not {kind!r}")


def configure(settings: Mapping[str, Any] | None = None, exporter: Any = None) -> None:
    """Turn tracing on with the configured exporter (or ``exporter``, e.g. an in-memory one)."""
    global _tracer
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "harness-gateway"}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider.add_span_processor(BatchSpanProcessor(_exporter(settings or {})))
    _tracer = provider.get_tracer("dataharness.gateway")
    _install_log_trace_ids()


def disable() -> None:
    global _tracer
    _tracer = None


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[Any]:
    """A child span of the current one (nothing when tracing is off)."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(name) as s:
        for k, v in attributes.items():
            if v is not None:
                s.set_attribute(k, v if isinstance(v, (str, int, float, bool)) else str(v))
        yield s


_NOT_LOADED: Any = object()
_propagate: Any = _NOT_LOADED


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the caller's current span, if OpenTelemetry is installed
    and a span is active (used by clients to join the caller's trace). Whether it is installed
    is looked up once: a failed import is not cached by Python, and clients ask per call."""
    global _propagate
    if _propagate is _NOT_LOADED:
        try:
            from opentelemetry import propagate

            _propagate = propagate
        except ImportError:
            _propagate = None
    if _propagate is None:
        return None
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    return carrier.get(TRACEPARENT)


def _install_log_trace_ids() -> None:
    """Every log record gets ``trace_id`` (hex, or "" outside a span)."""
    from opentelemetry import trace

    old = logging.getLogRecordFactory()
    if getattr(old, "_harness_trace", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = old(*args, **kwargs)
        ctx = trace.get_current_span().get_span_context()
        record.trace_id = format(ctx.trace_id, "032x") if ctx.is_valid else ""
        return record

    factory._harness_trace = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def traced_stream(name: str, reader: Any, **attributes: Any) -> Any:
    """``reader`` (a RecordBatchReader) whose whole consumption is the span ``name``, a child of
    the current span, with its batch and byte counts."""
    if _tracer is None:
        return reader
    import pyarrow as pa

    s = _tracer.start_span(name, attributes={k: str(v) for k, v in attributes.items()})

    def batches() -> Iterator[pa.RecordBatch]:
        count, size = 0, 0
        try:
            for batch in reader:
                count, size = count + 1, size + batch.nbytes
                yield batch
        finally:
            s.set_attribute("batches", count)
            s.set_attribute("bytes", size)
            s.end()

    return pa.RecordBatchReader.from_batches(reader.schema, batches())


class _TraceMiddleware(fl.ServerMiddleware):
    def __init__(self, server_span: Any) -> None:
        self.span = server_span

    def call_completed(self, exception: BaseException | None) -> None:
        if exception is not None:
            self.span.record_exception(exception)
        self.span.end()


class TraceFactory(fl.ServerMiddlewareFactory):
    """One server span per Flight call, child of the caller's ``traceparent`` (ended when the
    call completes, a DoGet stream included); handlers make it current with ``activate``."""

    def start_call(
        self, info: fl.CallInfo, headers: Mapping[str, Sequence[Any]]
    ) -> fl.ServerMiddleware | None:
        if _tracer is None:
            return None
        from opentelemetry import propagate, trace

        carrier = {}
        for k, v in headers.items():
            # Only the text headers propagation reads: a binary (``-bin``) header may hold
            # any bytes (grpc-trace-bin), and a call must not fail on one.
            if v and not k.lower().endswith("-bin"):
                value = v[0]
                if isinstance(value, bytes):
                    value = value.decode("utf-8", errors="replace")
                carrier[k.lower()] = str(value)
        parent = propagate.extract(carrier)
        method = str(info.method).rsplit(".", 1)[-1]
        return _TraceMiddleware(
            _tracer.start_span(f"flight.{method}", context=parent, kind=trace.SpanKind.SERVER)
        )


@contextlib.contextmanager
def activate(call: fl.ServerCallContext) -> Iterator[None]:
    """Make the call's server span current while its handler runs (middleware hooks run in
    another context than the handler, so they cannot)."""
    mw = call.get_middleware("trace") if _tracer is not None else None
    if mw is None:
        yield
        return
    from opentelemetry import context, trace

    token = context.attach(trace.set_span_in_context(mw.span))
    try:
        yield
    finally:
        context.detach(token)
