"""``kafka`` sources: one topic partition, state ``{"low": int, "high": int, "skip"?: [[a, b),
...]}`` (``skip``: offsets no commit owns, see ``planners.kafka.ranges``).

A task reads exactly offsets ``[low, high)`` by assigning the partition at ``low`` and consuming
until an offset >= ``high`` or the consumer position reaches ``high`` (offsets may have gaps:
transaction markers, compaction). Watermarks are never used for correctness.

Config (``KafkaConfig``): ``bootstrap_servers``, ``topic``, ``partition``, ``format`` (``json``
default, or ``avro`` with the Confluent wire format: inline ``avro_schema`` or
``schema_registry_url``), ``key_column`` (a table column filled from the message key),
``on_error`` (``fail`` default, or ``dead_letter``: undecodable messages go to
``dead_letter_topic`` keyed ``topic/partition/offset`` and are counted, never silently dropped),
``max_task_messages``, ``read_timeout_s``, and any ``consumer`` settings for librdkafka.

Metadata columns, when the table declares them: ``_kafka_partition``, ``_kafka_offset``,
``_kafka_timestamp``, ``_kafka_key``. Predicates on ``_kafka_offset`` narrow the range exactly;
``_kafka_timestamp >= / >`` moves ``low`` up with ``offsets_for_times`` (a lower bound only:
CreateTime timestamps need not be ordered). All value predicates are residual.

Writes: DoPut produces JSON (``planners.kafka.produce``). Streaming: offsets count once, when
they first enter ``[low, high)``, wherever a mover puts the rows later (``cumulative``).
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from flight_gateway.protocol.errors import Conflict, HarnessError, InvalidArgument
from planners import locations
from planners.common import conform, physical_names, target_schema
from planners.kafka import produce
from planners.kafka.cache import cache_key, cached_range
from planners.kafka.config import META, KafkaConfig, consumer
from planners.kafka.consume import consume_range
from planners.kafka.consumers import POOL, WAIT_S
from planners.kafka.decode import Decoder, dead_letter_counts
from planners.kafka.ranges import bounds, pieces, skips, visible, with_range
from planners.kind import (
    AppendContext,
    ColumnSpec,
    Pinned,
    Reach,
    ScanRequest,
    ScanTask,
    SourceKind,
    SourceRef,
)
from planners.predicates import ast as P

log = logging.getLogger(__name__)
__all__ = [
    "META",
    "KafkaConfig",
    "KafkaKind",
    "dead_letter_counts",
    "read_offsets",
    "with_range",
]


def _offset_bounds(predicate: P.Expr | None) -> tuple[int, int | None]:
    """[lo, hi) implied by top-level conjuncts on _kafka_offset (hi None: unbounded)."""
    lo, hi = 0, None
    for c in P.conjuncts(predicate):
        if isinstance(c, P.Cmp) and c.column == "_kafka_offset" and isinstance(c.value, int):
            v = c.value
            if c.op in (">=", ">"):
                lo = max(lo, v + (c.op == ">"))
            elif c.op in ("<", "<="):
                bound = v + (c.op == "<=")
                hi = bound if hi is None else min(hi, bound)
            elif c.op == "=":
                lo, hi = max(lo, v), v + 1 if hi is None else min(hi, v + 1)
        elif (
            isinstance(c, P.Between)
            and c.column == "_kafka_offset"
            and isinstance(c.low, int)
            and isinstance(c.high, int)
        ):
            lo = max(lo, c.low)
            hi = c.high + 1 if hi is None else min(hi, c.high + 1)
    return lo, hi


def _timestamp_lower_bound(predicate: P.Expr | None) -> int | None:
    """Milliseconds T such that only messages with timestamp >= T can match."""
    best = None
    for c in P.conjuncts(predicate):
        if (
            isinstance(c, P.Cmp)
            and c.column == "_kafka_timestamp"
            and c.op in (">=", ">")
            and c.value is not None
        ):
            ms = int(c.value.timestamp() * 1000)
            best = ms if best is None else max(best, ms)
    return best


#: librdkafka settings whose names look like network settings: the token endpoint of OIDC
#: (it receives the client secret) is checked like any service URI; the rest are not locations.
CONSUMER_NETWORK = {
    "sasl.oauthbearer.token.endpoint.url": "uri",
    "ssl.endpoint.identification.algorithm": "safe",
}


class KafkaKind(SourceKind):
    config_model = KafkaConfig
    dedupe_tier = 2  # the hottest tier: data flows Kafka -> Postgres -> cold formats
    cumulative = True
    warm_imports = ("confluent_kafka",)

    def configure_resources(self, settings: Mapping[str, Any]) -> None:
        """``limits.kinds.kafka``: ``max_consumers`` open at once in the whole process (0: two
        per core, at least 4) and ``consumer_wait_s`` a read waits for one
        (``planners.kafka.consumers``)."""
        unknown = sorted(set(settings) - {"max_consumers", "consumer_wait_s"})
        if unknown:
            raise ValueError(f"limits.kinds.kafka: unknown settings {unknown}")
        limit, wait = settings.get("max_consumers", 0), settings.get("consumer_wait_s", WAIT_S)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError(f"limits.kinds.kafka.max_consumers must be 0 or more, not {limit!r}")
        if not isinstance(wait, int | float) or isinstance(wait, bool) or not wait > 0:
            raise ValueError(f"limits.kinds.kafka.consumer_wait_s must be positive, not {wait!r}")
        POOL.configure(limit, float(wait))

    def resources(self) -> Mapping[str, float]:
        return {"consumers_open": POOL.open_count()}

    def maintain(self, pinned: Sequence[Pinned], grace_s: float) -> dict[str, Any]:
        return {"lost": retention_guard(pinned)}

    def validate_state(self, name: str, state: Mapping[str, Any]) -> None:
        skips(name, state)

    def reaches(self, source: SourceRef) -> list[Reach]:
        config: KafkaConfig = self.parse_config(source)
        out = [
            locations.host("bootstrap_servers", s, 9092)
            for s in config.bootstrap_servers.split(",")
            if s.strip()
        ]
        if config.schema_registry_url:
            out += locations.network_options(
                "config", {"schema_registry_url": config.schema_registry_url},
                {"schema_registry_url": "uris"},
            )  # fmt: skip
        return out + locations.network_options("consumer", config.consumer, CONSUMER_NETWORK)

    def _tasks(self, request: ScanRequest, low: int, high: int) -> list[ScanTask]:
        src = request.source
        config: KafkaConfig = self.parse_config(src)
        lo, hi = _offset_bounds(request.predicate)
        low, high = max(low, lo), min(high, hi) if hi is not None else high
        ts = _timestamp_lower_bound(request.predicate)
        if ts is not None and low < high:
            low = max(low, _offset_for_time(config, ts, low))
        if low >= high:
            return []
        step = config.max_task_messages
        ranges = visible(low, high, skips(src.name, src.state))
        request.check_task_count(sum(-(-(b - a) // step) for a, b in ranges))
        return [
            ScanTask(src.name, {"low": a, "high": min(a + step, b)})
            for start, b in ranges
            for a in range(start, b, step)
        ]

    def plan(self, request: ScanRequest) -> list[ScanTask]:
        return self._tasks(request, *bounds(request.source.name, request.source.state))

    def plan_added(self, request: ScanRequest, before: Mapping[str, Any] | None) -> list[ScanTask]:
        low, high = bounds(request.source.name, request.source.state)
        if before is not None:
            low = bounds(request.source.name, before)[1]
        return self._tasks(request, low, high) if high > low else []

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        src = request.source
        config: KafkaConfig = self.parse_config(src)
        cols = request.columns
        decoder = Decoder(src.name, config, cols)
        low, high = int(task.payload["low"]), int(task.payload["high"])
        key = cache_key(config, (decoder.value_schema, decoder.physical_schema))

        def consume(a: int, b: int) -> Iterator[tuple[pa.Table, array[int], int]]:
            """Decoded chunks of [a, b), each with how far it covers (the last: all of it)."""
            held: list[Any] | None = None
            for chunk in consume_range(config, a, b):
                if held is not None:
                    yield (*_decoded(decoder, held), held[-1].offset() + 1)
                held = chunk
            if held is not None:
                yield (*_decoded(decoder, held), b)

        def batches() -> Iterator[pa.RecordBatch]:
            for rows in cached_range(key, low, high, consume):
                yield from rows.to_batches()

        schema = decoder.physical_schema
        return conform(
            pa.RecordBatchReader.from_batches(schema, batches()),
            cols,
            physical_names(cols, schema.names),
        )

    def pieces(
        self, source: SourceRef, stored: Sequence[Mapping[str, Any]]
    ) -> list[Mapping[str, Any]]:
        """Offset ranges cut at chunk boundaries and where stored pieces end
        (``planners.kafka.ranges.pieces``)."""
        return list(pieces(source.name, source.state, stored))

    def append(self, ctx: AppendContext, rows: pa.Table) -> dict[str, Any]:
        return produce.append(self.parse_config(ctx.source), ctx, rows)

    def drain(
        self,
        ctx: AppendContext,
        moved: Mapping[str, Any],
        rows: pa.Table,
        key: Sequence[str],
        partial: bool,
    ) -> dict[str, Any]:
        """The moved range ``[low, high)`` leaves the partition's range: ``low`` becomes the
        moved ``high``; messages produced since (a higher ``high``) stay."""
        name = ctx.source.name
        if partial:
            raise InvalidArgument(
                f"source {name!r}: a Kafka partition moves whole offset ranges; drop 'where'"
            )
        low, high = bounds(name, moved)
        now_low, now_high = bounds(name, ctx.source.state)
        if now_low == high:
            return dict(ctx.source.state)  # drained already (a repeated move)
        if now_low != low:
            raise Conflict(
                f"source {name!r}: its range starts at {now_low}, not at the moved {low}"
            )
        return with_range(ctx.source.state, high, max(now_high, high))


def _decoded(decoder: Decoder, msgs: list[Any]) -> tuple[pa.Table, array[int]]:
    rows, kept = decoder.decode_kept(msgs)
    return rows, array("q", (m.offset() for m in kept))


def _offset_for_time(config: KafkaConfig, ms: int, low: int) -> int:
    from confluent_kafka import TopicPartition

    what = f"kafka {config.topic}/{config.partition} offsets for time"
    with POOL.lease(lambda _: consumer(config), what) as lease:
        try:
            (tp,) = lease.get(low).offsets_for_times(
                [TopicPartition(config.topic, config.partition, ms)], timeout=10
            )
        except HarnessError:
            raise
        except Exception as e:
            log.warning("offsets_for_times failed, not narrowing: %s", e)
            return low
    # -1: no message at or after ms (as far as the broker knows): do not narrow, the residual
    # filter keeps results exact.
    return int(tp.offset) if tp.offset >= 0 else low


def read_offsets(
    config: Mapping[str, Any],
    low: int,
    high: int,
    columns: Sequence[ColumnSpec],
    source: str = "kafka",
    skip: Sequence[Sequence[int]] = (),
) -> pa.Table:
    """All rows of ``[low, high)`` but the ``skip`` ranges (pass the source state's), with the
    given harness columns (for movers)."""
    ranges = visible(low, high, [(int(a), int(b)) for a, b in skip])
    if not ranges:
        return target_schema(columns).empty_table()
    ref = SourceRef(source, KafkaKind.name, config, {}, {"low": low, "high": high})
    req = ScanRequest(ref, tuple(columns))
    kind = KafkaKind()
    return pa.concat_tables(
        kind.read(req, ScanTask(source, {"low": a, "high": b})).read_all() for a, b in ranges
    )


# ---------------------------------------------------------------------------- maintenance


def _earliest_offset(config: KafkaConfig) -> int | None:
    from confluent_kafka import TopicPartition

    c = consumer(config, "harness-maintenance")
    try:
        low, _high = c.get_watermark_offsets(
            TopicPartition(config.topic, config.partition), timeout=10
        )
        return int(low)
    except Exception as e:  # an unreachable broker must not stop other housekeeping
        log.warning("cannot read earliest offset of %s/%d: %s", config.topic, config.partition, e)
        return None
    finally:
        c.close()


def retention_guard(pinned: Sequence[Pinned]) -> dict[str, int]:
    """``{"table/source": n}``: messages below the topic's earliest offset that the latest pin
    of a source still needs (topic retention ran ahead of the movers: rows are lost)."""
    latest: dict[tuple[str, str], Pinned] = {}
    for p in pinned:
        key = (p.table, p.source.name)
        if key not in latest or latest[key].version < p.version:
            latest[key] = p
    lost = {}
    for (table, name), p in latest.items():
        config = KafkaConfig.parse(p.source.config, where=f"source {name!r}")
        earliest = _earliest_offset(config)
        low = int(p.source.state.get("low", 0))
        lost[f"{table}/{name}"] = max(0, earliest - low) if earliest is not None else 0
    return lost
