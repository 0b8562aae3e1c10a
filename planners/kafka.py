"""``kafka`` sources: one topic partition, state ``{"low": int, "high": int}``.

A task reads exactly offsets ``[low, high)`` by assigning the partition at ``low`` and consuming
until an offset >= ``high`` or the consumer position reaches ``high`` (offsets may have gaps:
transaction markers, compaction). Watermarks are never used for correctness.

Config: ``bootstrap_servers``, ``topic``, ``partition``, ``format`` (``json`` default, or
``avro`` with the Confluent wire format: inline ``avro_schema`` or ``schema_registry_url``),
``key_column`` (a table column filled from the message key), ``on_error`` (``fail`` default,
or ``dead_letter``: undecodable messages go to ``dead_letter_topic`` keyed
``topic/partition/offset`` and are counted, never silently dropped), ``max_task_messages``,
``read_timeout_s``, and any ``consumer`` settings for librdkafka.

Metadata columns, when the table declares them: ``_kafka_partition``, ``_kafka_offset``,
``_kafka_timestamp``, ``_kafka_key``. Predicates on ``_kafka_offset`` narrow the range exactly;
``_kafka_timestamp >= / >`` moves ``low`` up with ``offsets_for_times`` (a lower bound only:
CreateTime timestamps need not be ordered). All value predicates are residual.
"""

from __future__ import annotations

import io
import json
import logging
import struct
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from flight_gateway.errors import InvalidArgument, Unavailable
from planners.base import (
    ColumnSpec,
    ScanRequest,
    ScanTask,
    SourceRef,
    conform,
    physical_names,
    target_schema,
)
from planners.predicates import ast as P

log = logging.getLogger(__name__)

META = {
    "_kafka_partition": pa.int32(),
    "_kafka_offset": pa.int64(),
    "_kafka_timestamp": pa.timestamp("ms", tz="UTC"),
    "_kafka_key": pa.binary(),
}
DEFAULT_TASK_MESSAGES = 250_000
BATCH_MESSAGES = 64 * 1024
#: Undecodable messages routed to a dead-letter topic, per source (observability).
dead_letter_counts: dict[str, int] = {}


def _config(config: Mapping[str, Any]) -> tuple[str, str, int]:
    servers, topic, partition = (
        config.get("bootstrap_servers"),
        config.get("topic"),
        config.get("partition"),
    )
    if not isinstance(servers, str) or not isinstance(topic, str) or not isinstance(partition, int):
        raise InvalidArgument(
            "kafka source config needs bootstrap_servers, topic and partition (int)"
        )
    return servers, topic, partition


def _consumer(config: Mapping[str, Any]) -> Any:
    from confluent_kafka import Consumer

    servers, _, _ = _config(config)
    settings = {
        "bootstrap.servers": servers,
        "group.id": f"harness-reader-{uuid.uuid4().hex}",  # never commits; assign() only
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "auto.offset.reset": "error",
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
        **dict(config.get("consumer", {})),
    }
    return Consumer(settings)


def _range(request: ScanRequest) -> tuple[int, int]:
    state = request.source.state
    low, high = state.get("low", 0), state.get("high", 0)
    if not isinstance(low, int) or not isinstance(high, int) or low < 0 or high < low:
        raise InvalidArgument(
            f"source {request.source.name!r}: state needs 0 <= low <= high, got {dict(state)}"
        )
    return low, high


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


class KafkaPlanner:
    def plan(self, request: ScanRequest) -> list[ScanTask]:
        src = request.source
        _, topic, partition = _config(src.config)
        low, high = _range(request)
        lo, hi = _offset_bounds(request.predicate)
        low, high = max(low, lo), min(high, hi) if hi is not None else high
        ts = _timestamp_lower_bound(request.predicate)
        if ts is not None and low < high:
            low = max(low, self._offset_for_time(src.config, topic, partition, ts, low))
        if low >= high:
            return []
        step = int(src.config.get("max_task_messages", DEFAULT_TASK_MESSAGES))
        return [
            ScanTask(
                src.name, src.kind, {"low": a, "high": min(a + step, high)}, exact_filter=False
            )
            for a in range(low, high, step)
        ]

    @staticmethod
    def _offset_for_time(
        config: Mapping[str, Any], topic: str, partition: int, ms: int, low: int
    ) -> int:
        from confluent_kafka import TopicPartition

        consumer = _consumer(config)
        try:
            (tp,) = consumer.offsets_for_times([TopicPartition(topic, partition, ms)], timeout=10)
        except Exception as e:
            log.warning("offsets_for_times failed, not narrowing: %s", e)
            return low
        finally:
            consumer.close()
        # -1: no message at or after ms (as far as the broker knows): do not narrow, the
        # residual filter keeps results exact.
        return tp.offset if tp.offset >= 0 else low

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        src = request.source
        cols = request.columns
        decoder = _Decoder(src.name, src.config, cols)
        low, high = int(task.payload["low"]), int(task.payload["high"])

        def batches() -> Iterator[pa.RecordBatch]:
            for chunk in consume_range(src.config, low, high):
                yield from decoder.decode(chunk).to_batches()

        schema = decoder.physical_schema
        return conform(
            pa.RecordBatchReader.from_batches(schema, batches()),
            cols,
            physical_names(cols, schema.names),
        )


def consume_range(
    config: Mapping[str, Any], low: int, high: int, chunk: int = BATCH_MESSAGES
) -> Iterator[list[Any]]:
    """Messages with low <= offset < high, in chunks; raises Unavailable if the range cannot
    be read completely (a read never ends early looking complete)."""
    from confluent_kafka import KafkaError, TopicPartition

    if low >= high:
        return
    _, topic, partition = _config(config)
    timeout = float(config.get("read_timeout_s", 30))
    consumer = _consumer(config)
    try:
        consumer.assign([TopicPartition(topic, partition, low)])
        next_offset = low
        last_progress = time.monotonic()
        out: list[Any] = []
        while next_offset < high:
            msgs = consumer.consume(num_messages=min(chunk, high - next_offset), timeout=0.5)
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise Unavailable(f"kafka {topic}/{partition}: {err}")
                off = m.offset()
                if off >= high:
                    next_offset = high
                    break
                out.append(m)
                next_offset = off + 1
            if msgs:
                last_progress = time.monotonic()
            else:
                # Offsets past the last message may be markers: the position tells.
                pos = consumer.position([TopicPartition(topic, partition)])[0].offset
                if pos >= high:
                    break
                if time.monotonic() - last_progress > timeout:
                    raise Unavailable(
                        f"kafka {topic}/{partition}: read stalled at offset {next_offset} of "
                        f"[{low}, {high}) for {timeout:.0f}s"
                    )
            if len(out) >= chunk:
                yield out
                out = []
        if out:
            yield out
    finally:
        consumer.close()


class _Decoder:
    """Message values -> Arrow, in bulk: pyarrow.json over newline-joined values, or fastavro."""

    def __init__(self, source: str, config: Mapping[str, Any], cols: Sequence[ColumnSpec]) -> None:
        self.source = source
        self.config = config
        self.format = str(config.get("format", "json")).lower()
        if self.format not in ("json", "avro"):
            raise InvalidArgument(f"kafka source {source!r}: format must be json or avro")
        self.on_error = str(config.get("on_error", "fail"))
        if self.on_error not in ("fail", "dead_letter"):
            raise InvalidArgument(f"kafka source {source!r}: on_error must be fail or dead_letter")
        if self.on_error == "dead_letter" and not config.get("dead_letter_topic"):
            raise InvalidArgument(
                f"kafka source {source!r}: on_error=dead_letter needs dead_letter_topic"
            )
        self.key_column = config.get("key_column")
        # Messages written before a rename carry the old name, later ones the new name, and one
        # topic may hold both: parse every name a column has had and coalesce them per row.
        self.candidates = {c.name: (c.name, *c.aliases) for c in cols if c.name not in META}
        parse_fields: dict[str, pa.Field] = {}
        for c in cols:
            if c.name in META or c.name == self.key_column:
                continue
            for name in self.candidates[c.name]:
                parse_fields.setdefault(name, pa.field(name, c.arrow_type))
        self.value_schema = pa.schema(list(parse_fields.values()))
        out = [pa.field(c.name, c.arrow_type) for c in cols if c.name not in META]
        meta = [pa.field(n, t) for n, t in META.items() if any(c.name == n for c in cols)]
        self.physical_schema = pa.schema(out + meta)
        self._avro_schemas: dict[int, Any] = {}

    # ---- values
    def _json(self, values: list[bytes]) -> pa.Table:
        opts = pajson.ParseOptions(
            explicit_schema=self.value_schema, unexpected_field_behavior="ignore"
        )
        data = b"\n".join(values)
        return pajson.read_json(
            io.BytesIO(data),
            parse_options=opts,
            read_options=pajson.ReadOptions(block_size=max(1 << 20, len(data) + 1)),
        )

    def _avro_schema(self, schema_id: int) -> Any:
        import fastavro

        if schema_id not in self._avro_schemas:
            inline = self.config.get("avro_schema")
            if inline is not None:
                raw = inline if not isinstance(inline, str) else json.loads(inline)
            elif self.config.get("schema_registry_url"):
                import urllib.request

                url = (
                    f"{str(self.config['schema_registry_url']).rstrip('/')}/schemas/ids/{schema_id}"
                )
                with urllib.request.urlopen(url, timeout=10) as resp:
                    raw = json.loads(json.loads(resp.read())["schema"])
            else:
                raise InvalidArgument(
                    f"kafka source {self.source!r}: avro needs avro_schema or schema_registry_url"
                )
            self._avro_schemas[schema_id] = fastavro.parse_schema(raw)
        return self._avro_schemas[schema_id]

    def _avro_one(self, value: bytes) -> dict[str, Any]:
        import fastavro

        if len(value) < 5 or value[0] != 0:
            raise ValueError("not Confluent Avro wire format (magic byte 0 + schema id)")
        (schema_id,) = struct.unpack(">I", value[1:5])
        record = fastavro.schemaless_reader(io.BytesIO(value[5:]), self._avro_schema(schema_id))
        if not isinstance(record, dict):
            raise ValueError("Avro value is not a record")
        return record

    def _decode_values(self, values: list[bytes | None]) -> tuple[pa.Table, list[int]]:
        """(table of decodable values, indexes of undecodable ones)."""
        if self.format == "avro":
            rows, bad = [], []
            for i, v in enumerate(values):
                try:
                    rows.append(self._avro_one(v) if v is not None else {})
                except Exception:
                    bad.append(i)
            table = (
                pa.Table.from_pylist(rows, schema=self.value_schema)
                if rows
                else self.value_schema.empty_table()
            )
            return table, bad
        plain = [v if v is not None else b"{}" for v in values]  # tombstone: all-null row
        if not any(b"\n" in v for v in plain):
            try:
                return self._json(plain), []
            except (pa.ArrowInvalid, ValueError):
                pass  # find the culprits one by one below
        parts, bad = [], []
        for i, v in enumerate(plain):
            try:
                parsed = self._json([json.dumps(json.loads(v)).encode()])
                if parsed.num_rows != 1:
                    raise ValueError("not one JSON object")
                parts.append(parsed)
            except (pa.ArrowInvalid, ValueError, UnicodeDecodeError):
                bad.append(i)
        return (pa.concat_tables(parts) if parts else self.value_schema.empty_table()), bad

    def decode(self, msgs: list[Any]) -> pa.Table:
        values = [m.value() for m in msgs]
        table, bad = self._decode_values(values)
        if bad:
            self._handle_bad([msgs[i] for i in bad])
            keep = sorted(set(range(len(msgs))) - set(bad))
            msgs = [msgs[i] for i in keep]
        columns: dict[str, Any] = {}
        for name, names in self.candidates.items():
            present = [table.column(n) for n in names if n in table.column_names]
            if not present:
                continue
            columns[name] = present[0] if len(present) == 1 else pc.coalesce(*present)
        if "_deleted" in self.candidates:
            # A null value (Kafka's tombstone convention) deletes its key in the primary-key view.
            tomb = pa.array([m.value() is None for m in msgs], pa.bool_())
            given = columns.get("_deleted")
            columns["_deleted"] = (
                tomb if given is None else pc.or_(pc.fill_null(given.cast(pa.bool_()), False), tomb)
            )
        if self.key_column:
            keys = [m.key() for m in msgs]
            t = next(f.type for f in self.physical_schema if f.name == self.key_column)
            columns[self.key_column] = pa.array(
                [k.decode() if k is not None else None for k in keys]
            ).cast(t)
        meta_cols = {f.name for f in self.physical_schema if f.name in META}
        if "_kafka_partition" in meta_cols:
            columns["_kafka_partition"] = pa.array([m.partition() for m in msgs], pa.int32())
        if "_kafka_offset" in meta_cols:
            columns["_kafka_offset"] = pa.array([m.offset() for m in msgs], pa.int64())
        if "_kafka_timestamp" in meta_cols:
            columns["_kafka_timestamp"] = pa.array(
                [m.timestamp()[1] for m in msgs], pa.timestamp("ms", tz="UTC")
            )
        if "_kafka_key" in meta_cols:
            columns["_kafka_key"] = pa.array([m.key() for m in msgs], pa.binary())
        return pa.table(
            [columns[f.name] for f in self.physical_schema], schema=self.physical_schema
        )

    def _handle_bad(self, msgs: list[Any]) -> None:
        where = ", ".join(f"{m.topic()}/{m.partition()}@{m.offset()}" for m in msgs[:5])
        if self.on_error == "fail":
            raise InvalidArgument(
                f"kafka source {self.source!r}: {len(msgs)} undecodable {self.format} message(s) at {where}"
                " (set on_error=dead_letter to route them aside)"
            )
        from confluent_kafka import Producer

        producer = Producer(
            {"bootstrap.servers": self.config["bootstrap_servers"], "enable.idempotence": True}
        )
        for m in msgs:
            producer.produce(
                str(self.config["dead_letter_topic"]),
                value=m.value(),
                key=f"{m.topic()}/{m.partition()}/{m.offset()}".encode(),
                headers=[("harness.source", self.source.encode())],
            )
        if producer.flush(30) != 0:
            raise Unavailable(
                f"kafka source {self.source!r}: could not write {len(msgs)} message(s) to the dead-letter topic"
            )
        dead_letter_counts[self.source] = dead_letter_counts.get(self.source, 0) + len(msgs)
        log.warning(
            "kafka source %s: %d undecodable message(s) sent to %s: %s",
            self.source,
            len(msgs),
            self.config["dead_letter_topic"],
            where,
        )


def read_offsets(
    config: Mapping[str, Any],
    low: int,
    high: int,
    columns: Sequence[ColumnSpec],
    source: str = "kafka",
) -> pa.Table:
    """All rows of ``[low, high)`` with the given harness columns (for movers)."""
    req = ScanRequest(SourceRef(source, "kafka", config, {}, {}), tuple(columns))
    if high <= low:
        return target_schema(columns).empty_table()
    return (
        KafkaPlanner().read(req, ScanTask(source, "kafka", {"low": low, "high": high})).read_all()
    )
