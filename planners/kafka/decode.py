"""Kafka message values -> Arrow, in bulk: pyarrow.json over newline-joined values, or fastavro
for the Confluent Avro wire format. Undecodable messages fail the read or go to a dead-letter
topic, never silently dropped."""

from __future__ import annotations

import io
import json
import logging
import struct
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from flight_gateway.protocol.errors import InvalidArgument, Unavailable
from planners.kafka.config import META, KafkaConfig
from planners.kind import ColumnSpec

log = logging.getLogger(__name__)
#: Undecodable messages routed to a dead-letter topic, per source (observability).
dead_letter_counts: dict[str, int] = {}


class Decoder:
    """Message values -> Arrow, in bulk: pyarrow.json over newline-joined values, or fastavro."""

    def __init__(self, source: str, config: KafkaConfig, cols: Sequence[ColumnSpec]) -> None:
        self.source = source
        self.config = config
        self.format = config.format
        self.on_error = config.on_error
        if self.on_error == "dead_letter" and not config.dead_letter_topic:
            raise InvalidArgument(
                f"kafka source {source!r}: on_error=dead_letter needs dead_letter_topic"
            )
        self.key_column = config.key_column
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
            inline = self.config.avro_schema
            if inline is not None:
                raw = inline if not isinstance(inline, str) else json.loads(inline)
            elif self.config.schema_registry_url:
                import urllib.request

                url = f"{self.config.schema_registry_url.rstrip('/')}/schemas/ids/{schema_id}"
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
        return self.decode_kept(msgs)[0]

    def decode_kept(self, msgs: list[Any]) -> tuple[pa.Table, list[Any]]:
        """The rows of ``msgs``, and the messages they come from (undecodable ones left out,
        or the read failed)."""
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
        rows = pa.table(
            [columns[f.name] for f in self.physical_schema], schema=self.physical_schema
        )
        return rows, msgs

    def _handle_bad(self, msgs: list[Any]) -> None:
        where = ", ".join(f"{m.topic()}/{m.partition()}@{m.offset()}" for m in msgs[:5])
        if self.on_error == "fail":
            raise InvalidArgument(
                f"kafka source {self.source!r}: {len(msgs)} undecodable {self.format} message(s) at {where}"
                " (set on_error=dead_letter to route them aside)"
            )
        from confluent_kafka import Producer

        from planners.kafka.produce import produce

        producer = Producer(
            {"bootstrap.servers": self.config.bootstrap_servers, "enable.idempotence": True}
        )
        for m in msgs:
            produce(
                producer,
                str(self.config.dead_letter_topic),
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
            self.config.dead_letter_topic,
            where,
        )
