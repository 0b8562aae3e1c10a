"""OpenTelemetry tracing, off by default and free when off.

``configure`` (from the gateway config's ``tracing`` section, or a test's exporter) installs a
tracer provider; until then ``span`` is a ``nullcontext`` and nothing is imported. When on:

- every call is a server span (``server_span``: the Flight face's middleware opens one) whose
  parent is the W3C ``traceparent`` header the caller sent (the Python client and the Spark
  source send theirs: ``flight_gateway.protocol.trace_context``);
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

log = logging.getLogger(__name__)
_tracer: Any = None
_provider: Any = None


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
        # One JSON object per line (the console's default is indented, many lines per span),
        # so the file can be read line by line like the JSON logs.
        return ConsoleSpanExporter(out=out, formatter=_json_line)
    if kind == "console":
        return ConsoleSpanExporter()
    raise ValueError(f"tracing.exporter must be otlp, console or file, not {kind!r}")


def _json_line(span: Any) -> str:
    return str(span.to_json(indent=None)) + "\n"


def configure(settings: Mapping[str, Any] | None = None, exporter: Any = None) -> None:
    """Turn tracing on with the configured exporter (or ``exporter``, e.g. an in-memory one)."""
    global _tracer, _provider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "harness-gateway"}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider.add_span_processor(BatchSpanProcessor(_exporter(settings or {})))
    _tracer, _provider = provider.get_tracer("dataharness.gateway"), provider
    _install_log_trace_ids()


def disable() -> None:
    """Stop tracing; spans still queued for the exporter are exported first."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


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


def server_span(method: str, headers: Mapping[str, Sequence[Any]]) -> Any:
    """A server span for a call to ``method`` (None when tracing is off), child of the W3C
    ``traceparent`` among the call's headers; the face ends it when the call completes."""
    if _tracer is None:
        return None
    from opentelemetry import propagate, trace

    carrier = {}
    for k, v in headers.items():
        # Only the text headers propagation reads: a binary (``-bin``) header may hold any
        # bytes (grpc-trace-bin), and a call must not fail on one.
        if v and not k.lower().endswith("-bin"):
            value = v[0]
            if isinstance(value, bytes):
                value = value.decode("utf-8", errors="replace")
            carrier[k.lower()] = str(value)
    parent = propagate.extract(carrier)
    return _tracer.start_span(method, context=parent, kind=trace.SpanKind.SERVER)


@contextlib.contextmanager
def current(server: Any) -> Iterator[None]:
    """Make ``server`` (a span from ``server_span``, or None) the current span."""
    if server is None or _tracer is None:
        yield
        return
    from opentelemetry import context, trace

    token = context.attach(trace.set_span_in_context(server))
    try:
        yield
    finally:
        context.detach(token)
