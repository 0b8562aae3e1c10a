"""The client's connections to gateways: Flight clients per address, call options (token,
trace parent, timeout), failover to replicas and waits on busy refusals (``failover``), and
Flight errors turned back into the harness's typed errors."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from clients.failover import IDEMPOTENT_ACTIONS, Replicas
from flight_gateway.protocol.allocator import tune_for_flight
from flight_gateway.protocol.flight_errors import from_flight_error
from flight_gateway.protocol.trace_context import current_traceparent

log = logging.getLogger(__name__)

#: gRPC hands Flight message bodies over zero-copy at whatever offset the protobuf framing puts
#: them, so value buffers are often not aligned to their type's width (Acero then warns "An input
#: buffer was poorly aligned" when the table is scanned, e.g. by DuckDB). The IPC reader copies
#: only the buffers that are misaligned, once, as the batches are decoded.
_READ_OPTIONS = pa.ipc.IpcReadOptions(ensure_alignment=pa.ipc.Alignment.DataTypeSpecific)


class Transport:
    """Connections to one gateway and its replicas."""

    def __init__(
        self,
        uri: str,
        token: str | None = None,
        *,
        max_workers: int = 8,
        tls_root_certs: bytes | None = None,
        timeout_s: float | None = None,
        tls_cert_chain: bytes | None = None,
        tls_private_key: bytes | None = None,
        replicas: Sequence[str] = (),
        failover_s: float | None = None,
        failback_s: float | None = 5.0,
        traceparent: str | None = None,
        busy_wait_s: float = 30.0,
    ) -> None:
        """``tls_root_certs`` verifies the gateway; ``tls_cert_chain``/``tls_private_key`` are
        this client's certificate when the gateway requires mutual TLS. ``replicas``: other
        gateways on the same catalog; calls that are safe to repeat move to the next one when
        a gateway cannot be reached, for up to ``failover_s`` (default 60 s with replicas, 0
        without: fail at once), so also across a restart (``clients.failover``); after moving
        off ``uri``, calls try it again ``failback_s`` later and stay once it answers (None:
        never). A call a gateway refused because a concurrency limit was full
        (``errors.Busy``) is repeated with a back-off for up to ``busy_wait_s`` (0: raise at
        once)."""
        self.uri = uri
        #: A W3C trace parent to send (else the current OpenTelemetry span's, if any).
        self._traceparent = traceparent
        # gRPC's message buffers (flight_gateway.protocol.allocator): process-wide, so opt-in here.
        tune_for_flight(default_on=False)
        window = failover_s if failover_s is not None else (60.0 if replicas else 0.0)
        self._replicas = Replicas([uri, *replicas], window, busy_wait_s, failback_s=failback_s)
        self._headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._tls: dict[str, bytes] = {}
        if tls_root_certs:
            self._tls["tls_root_certs"] = tls_root_certs
        if tls_cert_chain and tls_private_key:
            self._tls.update(cert_chain=tls_cert_chain, private_key=tls_private_key)
        self._timeout = timeout_s
        self._max_workers = max_workers
        self._clients: dict[str, fl.FlightClient] = {}
        self._public_key: str | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ plumbing

    def _client(self, uri: str) -> fl.FlightClient:
        with self._lock:
            c = self._clients.get(uri)
            if c is None:
                c = fl.FlightClient(uri, **self._tls)
                self._clients[uri] = c
            return c

    def _options(self) -> fl.FlightCallOptions:
        headers = self._headers
        parent = self._traceparent or current_traceparent()
        if parent:  # the gateway's spans join the caller's trace
            headers = [*headers, (b"traceparent", parent.encode())]
        return fl.FlightCallOptions(
            headers=headers, timeout=self._timeout, read_options=_READ_OPTIONS
        )

    def close(self) -> None:
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def action(self, name: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run a ``harness.*`` action and return its JSON result."""
        payload = fl.Action(name, json.dumps(body or {}).encode())

        def call(uri: str) -> list[Any]:
            return list(self._client(uri).do_action(payload, self._options()))

        try:
            results = self._replicas.run(call, unsent_only=name not in IDEMPOTENT_ACTIONS)
        except (fl.FlightError, pa.ArrowException, OSError) as e:
            raise from_flight_error(e) from e
        return json.loads(results[0].body.to_pybytes()) if results else {}

    # ------------------------------------------------------------------ reads

    @staticmethod
    def _locations(ep: fl.FlightEndpoint) -> list[str]:
        """The endpoint's own gateway addresses (none: the one that planned it, or any)."""
        out = []
        for loc in ep.locations:
            uri = loc.uri.decode() if isinstance(loc.uri, bytes) else str(loc.uri)
            if uri and not uri.startswith("arrow-flight-reuse-connection"):
                out.append(uri)
        return out

    @property
    def has_replicas(self) -> bool:
        return len(self._replicas.uris) > 1
