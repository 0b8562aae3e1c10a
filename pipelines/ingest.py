"""Ingest helpers for the manifesto's simple and medium examples.

- ``KafkaIngester``: a consumer loop that, every ``interval_s``, commits the highest offset seen
  per partition as the ``high`` of that partition's Kafka source, and its consumer position as
  ``external_state`` in the same commit, so the two never disagree.
- ``PostgresUpsertWriter``: upserts rows into a system-versioned table through the gateway (a
  DoPut merge), which advances the source's ``as_of`` safely.

The ingester takes the source's lock for its commit, because moves change the same source
state (a move sets ``low``, the ingester ``high``): the lock makes its read-modify-write safe.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from clients.client import HarnessClient
from flight_gateway.protocol import operations as ops

log = logging.getLogger(__name__)


class KafkaIngester:
    """Consume ``topic`` and advance the harness ``high`` of each partition's source.

    ``sources`` maps partition number -> harness source name. ``on_messages`` (optional) sees
    every polled batch first, e.g. to index or to forward; the harness makes messages visible
    once their offsets are committed here.
    """

    def __init__(
        self,
        client: HarnessClient,
        table: str,
        bootstrap_servers: str,
        topic: str,
        sources: Mapping[int, str],
        *,
        group_id: str = "harness-ingester",
        interval_s: float = 2.0,
        on_messages: Callable[[list[Any]], None] | None = None,
    ) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.client, self.table, self.topic = client, table, topic
        self.sources = dict(sources)
        self.group_id = group_id
        self.interval_s = interval_s
        self.on_messages = on_messages
        self._seen: dict[int, int] = {}
        start = self._start_offsets()
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                # The broker answers a fetch when data arrives or after this wait: keep it
                # below the commit interval, or it bounds how fresh a commit can be.
                "fetch.wait.max.ms": max(10, min(500, int(interval_s * 250))),
            }
        )
        self.consumer.assign([TopicPartition(topic, p, start[p]) for p in self.sources])

    def _key(self, partition: int) -> str:
        return f"kafka.{self.group_id}.{self.topic}.{partition}"

    def _start_offsets(self) -> dict[int, int]:
        """Resume from the position committed with the table (external_state), else the source's high."""
        d = self.client.describe(self.table)
        return {
            p: int(d.external_state.get(self._key(p), d.source(name).state.get("high", 0)))
            for p, name in self.sources.items()
        }

    def poll(self, timeout_s: float = 0.2) -> int:
        msgs = [m for m in self.consumer.consume(10_000, timeout=timeout_s) if m.error() is None]
        if msgs and self.on_messages is not None:
            self.on_messages(msgs)
        for m in msgs:
            p, off = m.partition(), m.offset()
            if p is not None and off is not None:
                self._seen[p] = max(self._seen.get(p, -1), off)
        return len(msgs)

    def commit(self) -> int | None:
        """Commit new highs (and the consumer position) in one harness commit; None if nothing new."""
        names = [self.sources[p] for p in self._seen]
        if not names:
            return None
        with self.client.lock(
            self.table, names, owner=f"ingester-{self.group_id}", ttl_s=30, wait_s=30
        ) as lock:
            updates, ext = [], {}
            desc = self.client.describe(self.table)
            for p, last in self._seen.items():
                state = desc.source(self.sources[p]).state
                high = last + 1
                if high > int(state.get("high", 0)):
                    updates.append(
                        {
                            "source": self.sources[p],
                            "state": {**state, "high": high},  # skips lie below high
                        }
                    )
                ext[self._key(p)] = high
            if not updates:
                return None
            version = self.client.commit(
                self.table,
                lock=lock,
                updates=updates,
                external_state=ext,
                summary={ops.OPERATION: ops.KAFKA_INGEST},
            )
        log.debug("ingester %s: committed highs %s as version %d", self.group_id, ext, version)
        return version

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set, committing every ``interval_s`` (and once at the end)."""
        last = time.monotonic()
        try:
            while not stop.is_set():
                # A batch poll waits its whole timeout unless it fills: never past the next
                # commit, or messages would wait for the poll on top of the interval.
                left = self.interval_s - (time.monotonic() - last)
                self.poll(min(0.2, max(0.005, left)))
                if time.monotonic() - last >= self.interval_s:
                    self.commit()
                    self._seen.clear()
                    last = time.monotonic()
            self.commit()
        finally:
            self.consumer.close()


class PostgresUpsertWriter:
    """Upsert rows into the system-versioned Postgres table behind a ``postgres`` source: a
    DoPut merge by the table's primary key (the gateway's Postgres kind writes them and
    advances ``as_of`` under the source's lock, in one commit)."""

    def __init__(self, client: HarnessClient, table: str, source: str) -> None:
        self.client, self.table, self.source = client, table, source

    def close(self) -> None:
        """Nothing to release: the gateway holds the connections."""

    def write(
        self, rows: pa.Table | Sequence[Mapping[str, Any]], *, commit_id: str | None = None
    ) -> int:
        """Upsert ``rows`` and commit the new ``as_of``; returns the harness version."""
        data = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist([dict(r) for r in rows])
        if not data.num_rows:
            raise ValueError("nothing to write")
        out = self.client.put(
            self.table, data, commit_id=commit_id or uuid.uuid4().hex, source=self.source,
            merge=True,
        )  # fmt: skip
        return int(out["version"])
