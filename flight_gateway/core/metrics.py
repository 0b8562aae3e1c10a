"""Prometheus metrics of the gateway, served on ``metrics_port`` when the config sets one.

The metrics live in one registry for the process (several gateways in one process, as in tests,
add to the same counters). What is counted, and where:

- every RPC by method and status, with its latency (``flight_errors`` wraps every handler);
- rows and bytes served per table and source kind (each DoGet stream as it flows);
- commits by outcome, lock requests by outcome, lock expiries seen by writers;
- group-commit groups, commits and the largest group (read from the catalog when scraped);
- ticket rejections (tampered, expired, another principal's);
- rows a pinned version needs that its source lost (e.g. Kafka retention; maintenance);
- memory by allocator (glibc malloc in use / free / mmapped, Arrow), threads, and what source
  kinds hold (``harness_kind_resources``: the kafka kind's open consumers).

A ``table`` label only ever names a table of the catalog: callers choose the names they send,
so a request on a table that does not exist is counted under ``UNKNOWN_TABLE`` (one series per
made-up name would grow the registry without bound).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)
#: The ``table`` label of requests on a table the catalog does not have.
UNKNOWN_TABLE = "(unknown)"

RPCS = Counter(
    "harness_rpc", "Flight calls by method and status", ["method", "status"], registry=REGISTRY
)
RPC_SECONDS = Histogram(
    "harness_rpc_seconds",
    "Flight call latency (DoGet: until its first batch is ready)",
    ["method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
ROWS = Counter(
    "harness_rows_served", "Rows streamed by DoGet", ["table", "kind"], registry=REGISTRY
)
BYTES = Counter(
    "harness_bytes_served", "Arrow bytes streamed by DoGet", ["table", "kind"], registry=REGISTRY
)
COMMITS = Counter("harness_commits", "Commits by outcome", ["table", "outcome"], registry=REGISTRY)
SQL_CACHE = Counter(
    "harness_sql_cache",
    "Flight SQL per-version caches by outcome (types: result schemas; relations: planned tables)",
    ["cache", "outcome"],
    registry=REGISTRY,
)
SQL_EARLY = Counter(
    "harness_sql_early_starts",
    "Flight SQL statements started at GetFlightInfo: started, taken by their DoGet, abandoned",
    ["outcome"],
    registry=REGISTRY,
)
LOCKS = Counter("harness_lock_requests", "Lock requests by outcome", ["outcome"], registry=REGISTRY)
DOPUT_GROUP_SIZE = Histogram(
    "harness_doput_group_size",
    "DoPuts to the same sources of a table committed under one write lease (concurrent uploads "
    "queued in this gateway share the leader's lease and its fresh read of the table)",
    buckets=(1, 2, 4, 8, 16),
    registry=REGISTRY,
)
WRITE_LEASE_SECONDS = Histogram(
    "harness_write_lease_seconds",
    "The gateway's own write leases (DoPut, commit_write, move): time waited for the lock, and "
    "time held",
    ["work", "stage"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    registry=REGISTRY,
)
LOCK_EXPIRED = Counter(
    "harness_lock_expired", "Commits refused because their lock had expired", registry=REGISTRY
)
AUTH_FAILURES = Counter(
    "harness_auth_failures", "Calls refused for missing or invalid credentials", registry=REGISTRY
)
TICKETS_REJECTED = Counter(
    "harness_ticket_rejections", "DoGet tickets refused", ["reason"], registry=REGISTRY
)
PINNED_LOST = Gauge(
    "harness_pinned_rows_lost",
    "Rows a retained version pins that its source no longer holds, e.g. Kafka messages below "
    "the topic's earliest offset (0 when none; set by maintenance)",
    ["table", "source"],
    registry=REGISTRY,
)


class _GroupCommits(Collector):
    """Group-commit totals of the catalogs registered with ``watch_catalog``."""

    def __init__(self) -> None:
        self.catalogs: list[Any] = []

    def collect(self) -> Iterator[Any]:
        groups = CounterMetricFamily("harness_group_commit_groups", "Catalog groups applied")
        commits = CounterMetricFamily("harness_group_commit_commits", "Commits applied in groups")
        largest = GaugeMetricFamily("harness_group_commit_largest", "Largest group so far")
        g = c = big = 0
        for cat in self.catalogs:
            stats = cat.group_commit_stats()
            if stats is not None:
                g, c, big = g + stats.groups, c + stats.commits, max(big, stats.largest)
        groups.add_metric([], g)
        commits.add_metric([], c)
        largest.add_metric([], big)
        yield from (groups, commits, largest)


_GROUPS = _GroupCommits()
REGISTRY.register(_GROUPS)


class _Memory(Collector):
    """Where the process's memory is, read when scraped: what glibc malloc holds (in use, free
    inside its heaps, mmapped) and its arenas, Arrow's allocator, threads and kinds' resources."""

    def collect(self) -> Iterator[Any]:
        from flight_gateway.protocol.allocator import malloc_arenas, malloc_bytes
        from planners.registry import resources

        held = malloc_bytes()
        if held is not None:
            family = GaugeMetricFamily(
                "harness_malloc_bytes", "glibc malloc memory by state", labels=["state"]
            )
            for state, value in held.items():
                family.add_metric([state], value)
            yield family
        arenas = malloc_arenas()
        if arenas is not None:
            yield GaugeMetricFamily("harness_malloc_arenas", "glibc malloc arenas", value=arenas)
        yield GaugeMetricFamily(
            "harness_arrow_allocated_bytes",
            "Bytes allocated by Arrow's default memory pool",
            value=pa.total_allocated_bytes(),
        )
        yield GaugeMetricFamily("harness_threads", "Threads of the process", value=_threads())
        held_by_kinds = GaugeMetricFamily(
            "harness_kind_resources",
            "What source kinds hold for the whole process (the kafka kind: consumers_open)",
            labels=["kind", "resource"],
        )
        for kind, kind_held in resources().items():
            for resource, amount in kind_held.items():
                held_by_kinds.add_metric([kind, resource], amount)
        yield held_by_kinds


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


REGISTRY.register(_Memory())


def watch_catalog(catalog: Any) -> None:
    if catalog not in _GROUPS.catalogs:
        _GROUPS.catalogs.append(catalog)


def serve(port: int, host: str = "127.0.0.1") -> Any:
    """Start the ``/metrics`` HTTP endpoint; returns its server (``server_port``, ``shutdown``)."""
    server, _thread = start_http_server(port, addr=host, registry=REGISTRY)
    log.info("metrics on http://%s:%d/metrics", host, server.server_port)
    return server


def status_of(e: BaseException | None) -> str:
    """The Flight status a handler's outcome maps to (for labels)."""
    if e is None:
        return "OK"
    from flight_gateway.protocol import errors

    by_type = [
        (errors.InvalidArgument, "INVALID_ARGUMENT"),
        (errors.NotFound, "NOT_FOUND"),
        (errors.AlreadyExists, "ALREADY_EXISTS"),
        (errors.LockExpired, "FAILED_PRECONDITION"),
        (errors.Conflict, "FAILED_PRECONDITION"),
        (errors.Unauthenticated, "UNAUTHENTICATED"),
        (errors.Unauthorized, "PERMISSION_DENIED"),
        (errors.Unavailable, "UNAVAILABLE"),
        (errors.ResourceExhausted, "RESOURCE_EXHAUSTED"),
        (errors.TimedOut, "DEADLINE_EXCEEDED"),
        (errors.Cancelled, "CANCELLED"),
        (NotImplementedError, "UNIMPLEMENTED"),
        (RecursionError, "INVALID_ARGUMENT"),  # nesting too deep (faces.flight.errors)
    ]
    for cls, name in by_type:
        if isinstance(e, cls):
            return name
    return _arrow_status(e)


def _arrow_status(e: BaseException) -> str:
    """The status of an Arrow or Flight error as pyarrow sends it; anything else is a bug the
    call answered INTERNAL (a closed set of labels: the exception's own type name made one
    series per type, and an alert on INTERNAL missed them)."""
    import pyarrow as pa
    import pyarrow.flight as fl

    by_type: list[tuple[type[BaseException], str]] = [
        (fl.FlightUnauthenticatedError, "UNAUTHENTICATED"),
        (fl.FlightUnauthorizedError, "PERMISSION_DENIED"),
        (fl.FlightUnavailableError, "UNAVAILABLE"),
        (fl.FlightTimedOutError, "DEADLINE_EXCEEDED"),
        (fl.FlightCancelledError, "CANCELLED"),
        (fl.FlightServerError, "UNKNOWN"),
        (pa.ArrowInvalid, "INVALID_ARGUMENT"),
        (pa.ArrowKeyError, "NOT_FOUND"),
        (pa.ArrowNotImplementedError, "UNIMPLEMENTED"),
    ]
    for cls, name in by_type:
        if isinstance(e, cls):
            return name
    return "INTERNAL"


def observe_rpc(method: str, started: float, error: BaseException | None) -> None:
    RPCS.labels(method, status_of(error)).inc()
    RPC_SECONDS.labels(method).observe(time.perf_counter() - started)


def counted(reader: pa.RecordBatchReader, table: str, kind: str) -> pa.RecordBatchReader:
    """``reader`` unchanged, counting rows and bytes as they are streamed."""
    rows, nbytes = ROWS.labels(table, kind), BYTES.labels(table, kind)

    def gen() -> Iterator[pa.RecordBatch]:
        for batch in reader:
            rows.inc(batch.num_rows)
            nbytes.inc(batch.nbytes)
            yield batch

    return pa.RecordBatchReader.from_batches(reader.schema, gen())
