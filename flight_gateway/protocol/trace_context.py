"""The caller's side of tracing: the W3C ``traceparent`` a client sends with each call, so the
gateway's spans join the caller's trace (``flight_gateway.core.tracing`` is the server's)."""

from __future__ import annotations

from typing import Any

TRACEPARENT = "traceparent"
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
