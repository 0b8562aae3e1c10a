"""The ``kafka`` source config and its metadata columns."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

from flight_gateway.protocol.errors import InvalidArgument
from planners.kind import SourceConfig

# librdkafka settings a table writer must not choose: they load libraries, run commands, read
# local files as credentials, or point the consumer elsewhere than the checked brokers.
_REFUSED = frozenset(
    {
        "plugin.library.paths",
        "sasl.kerberos.kinit.cmd",
        "bootstrap.servers",
        "metadata.broker.list",
        "group.id",
        "enable.auto.commit",
    }
)
_REFUSED_SUFFIXES = (".location", ".engine.location")

META = {
    "_kafka_partition": pa.int32(),
    "_kafka_offset": pa.int64(),
    "_kafka_timestamp": pa.timestamp("ms", tz="UTC"),
    "_kafka_key": pa.binary(),
}
DEFAULT_TASK_MESSAGES = 250_000


@dataclass(frozen=True, kw_only=True)
class KafkaConfig(SourceConfig):
    bootstrap_servers: str
    topic: str
    partition: int
    format: Literal["json", "avro"] = "json"
    #: Avro value schema (JSON text or object), or a Confluent schema registry to look ids up.
    avro_schema: Any = None
    schema_registry_url: str | None = None
    #: A table column filled from the message key.
    key_column: str | None = None
    on_error: Literal["fail", "dead_letter"] = "fail"
    dead_letter_topic: str | None = None
    max_task_messages: int = DEFAULT_TASK_MESSAGES
    read_timeout_s: float = 30.0
    #: Extra librdkafka consumer settings.
    consumer: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_task_messages < 1:
            raise InvalidArgument("max_task_messages must be >= 1")
        refused = sorted(k for k in self.consumer if k in _REFUSED or k.endswith(_REFUSED_SUFFIXES))
        if refused:
            raise InvalidArgument(
                f"kafka consumer settings {refused} load code, run commands or redirect the "
                "consumer; not allowed"
            )


def consumer(config: KafkaConfig, group_prefix: str = "harness-reader") -> Any:
    """A consumer that never commits offsets (``assign`` only)."""
    from confluent_kafka import Consumer

    settings = {
        "bootstrap.servers": config.bootstrap_servers,
        "group.id": f"{group_prefix}-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "auto.offset.reset": "error",
        # A read prefetches at most 8K messages / 4 MB ahead of its decoding (librdkafka's
        # defaults: 100,000 messages or 64 MB per consumer), and fetches again 5 ms after its
        # queue drains: the default waits a whole second once the queue was full (400,000
        # messages consumed in 2.15 s with the defaults, 0.3 s with these). What many
        # concurrent reads cost is mostly the consumers themselves (docs/operations.md).
        "queued.min.messages": 8 * 1024,
        "queued.max.messages.kbytes": 4 * 1024,
        "fetch.queue.backoff.ms": 5,
        "fetch.max.bytes": 8 * 1024 * 1024,
        "max.partition.fetch.bytes": 4 * 1024 * 1024,
        **config.consumer,
    }
    return Consumer(settings)
