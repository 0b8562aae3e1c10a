"""The gateway process: the core and the faces its config lists, assembled in one place.

``HarnessFlightServer(catalog, config)`` builds the core (``core.services.Core``) and mounts the
faces: native Flight always (the port clients use), Flight SQL carried by it, the Iceberg REST
catalog when ``iceberg_rest_port`` is set, Prometheus metrics when ``metrics_port`` is set.
``harness-gateway serve`` runs one; tests and examples run one in a thread. A new face is a
module under ``faces/`` mounted here; nothing else changes.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from typing import Any

from flight_gateway.catalog import Catalog
from flight_gateway.core import metrics, tracing
from flight_gateway.core.config import GatewayConfig
from flight_gateway.core.secrets import ScrubFilter
from flight_gateway.core.services import Core
from flight_gateway.faces.flight.readers import ReadProcesses
from flight_gateway.faces.flight.server import FlightFace
from flight_gateway.faces.flightsql.service import FlightSqlService
from flight_gateway.protocol.allocator import trim_periodically, tune_for_flight
from planners.registry import warm

__all__ = ["GatewayConfig", "HarnessFlightServer"]
log = logging.getLogger(__name__)


def _install_scrub_filter() -> None:
    """Secret values never reach a log line, whoever logs them (handlers, libraries)."""
    root = logging.getLogger()
    if not any(isinstance(f, ScrubFilter) for f in root.filters):
        root.addFilter(ScrubFilter())
    for handler in root.handlers:
        if not any(isinstance(f, ScrubFilter) for f in handler.filters):
            handler.addFilter(ScrubFilter())


_collector_tuned = threading.Lock()


def _tune_collector() -> None:
    """What start-up made (modules, kinds warmed: ~220 k objects) frozen out of the cycle
    collector's passes, once per process. Over the 99 TPC-DS statements' first run the
    gateway spent ~0.2 s in collections, one of them a full one of 160 ms, mostly over
    start-up's objects; ~90 ms with them frozen (~30 ms with the youngest generation also
    collected 30 times less often, left as Python sets it: garbage in cycles, such as an
    exception's frames holding Arrow buffers, would then stay longer under load).
    ``HARNESS_GC_TUNING=0`` leaves the collector as it is (an application running a gateway
    in its own process may tune it itself)."""
    if os.environ.get("HARNESS_GC_TUNING", "1").strip().lower() in ("0", "false", "no"):
        return
    if not _collector_tuned.acquire(blocking=False):  # never released: once per process
        return
    gc.collect()  # garbage frozen would never be collected
    gc.freeze()


class HarnessFlightServer:
    """One gateway: its core and faces. ``serve`` blocks on the Flight face; ``shutdown`` stops
    every face."""

    def __init__(self, catalog: Catalog, config: GatewayConfig) -> None:
        # Before gRPC starts its threads: an arena limit set after threads have made their own
        # arenas does not take them back (flight_gateway.protocol.allocator).
        tune_for_flight()  # DoPut bodies arrive in gRPC's buffers too
        _install_scrub_filter()
        if config.tracing:
            tracing.configure(config.tracing)
        trim_periodically()  # free memory scattered in thread arenas goes back to the system
        self.catalog, self.config = catalog, config
        self.core = Core.build(catalog, config)
        limits = self.core.gw.limits
        self.sql = FlightSqlService(
            self.core, config.ticket_key_bytes(), config.ticket_ttl_s, limits.sql(),
            workers=limits.max_concurrent_statements,
        )  # fmt: skip
        self.readers = (
            ReadProcesses(
                catalog.engine.url.render_as_string(hide_password=False),
                config,
                config.read_processes,
            )
            if config.read_processes
            else None
        )
        self.flight = FlightFace(self.core, config, carried=[self.sql], readers=self.readers)
        self.rest = self._iceberg_rest()
        metrics.watch_catalog(catalog)
        self._warm_kinds()
        self._metrics_http = (
            None
            if config.metrics_port is None
            else metrics.serve(config.metrics_port, config.metrics_host)
        )
        _tune_collector()
        if not self.core.gw.reach.any and not config.reach:
            log.warning("no 'reach' allow-list configured: sources can reach nothing")
        log.info(
            "harness gateway on %s (catalog %s)",
            self.uri,
            catalog.engine.url.render_as_string(hide_password=True),
        )

    def _warm_kinds(self) -> None:
        """The kinds of the catalog's sources warmed (``SourceKind.warm``), off the first
        requests' path; a catalog that cannot say is left to the first reads."""
        try:
            kinds = self.catalog.source_kinds()
        except Exception as e:
            log.warning("source kinds not warmed: %s", e)
            return
        warm(kinds)

    def _iceberg_rest(self) -> Any:
        if self.config.iceberg_rest_port is None:
            return None
        from flight_gateway.faces.iceberg_rest.server import mount

        return mount(self.core, self.config)

    # The running process, as callers use it.
    @property
    def gw(self) -> Any:
        return self.core.gw

    @property
    def reads(self) -> Any:
        return self.core.reads

    @property
    def port(self) -> int:
        return int(self.flight.port)

    @property
    def uri(self) -> str:
        return self.flight.uri

    @property
    def metrics_port(self) -> int | None:
        return None if self._metrics_http is None else int(self._metrics_http.server_port)

    def serve(self) -> None:
        self.flight.serve()

    def shutdown(self) -> None:
        if self.rest is not None:
            self.rest.shutdown()
        self.flight.shutdown()
        if self.readers is not None:
            self.readers.close()
        self.sql.close()
        self.core.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
