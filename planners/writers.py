"""Appending rows to writable sources, idempotently by commit id.

Each ``append_*`` writes ``rows`` (already validated and cast to the harness schema) to one
source and returns the source's new state. Nothing is visible until the caller's harness
commit, and a retry with the same commit id after a lost reply or a crash writes nothing twice:

- files: the new file's name is derived from the commit id, so a retry rewrites the same file;
- iceberg: the append carries ``harness.commit-id``; a retry finds that snapshot and reuses it;
- postgres: the rows and the commit id (in ``harness_doput_log``) are written in one
  transaction; a retry finds the id and skips the write;
- kafka: every message carries ``harness.commit-id`` and ``harness.row`` headers; before
  producing, the caller records where this commit started (``external_state``), and a retry
  scans from there and produces only the rows that are missing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from flight_gateway.errors import InvalidArgument, Unavailable
from planners.base import SourceRef
from planners.predicates import quote_ident

log = logging.getLogger(__name__)
WRITABLE = ("files", "iceberg", "postgres", "kafka")


def _physical(
    rows: pa.Table, available: list[str], aliases: Mapping[str, tuple[str, ...]]
) -> pa.Table:
    """Rename harness columns to the names the source uses (a column renamed in the harness
    keeps its physical name in sources with their own schema)."""
    names = []
    for n in rows.column_names:
        names.append(next((c for c in (n, *aliases.get(n, ())) if c in available), n))
    return rows.rename_columns(names)


def append_files(source: SourceRef, rows: pa.Table, commit_id: str) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from planners.files import file_format, resolve_paths

    if file_format(source.config) != "parquet":
        raise InvalidArgument(f"source {source.name!r}: DoPut writes Parquet files only")
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in commit_id)[:120]
    name = f"harness-{safe}.parquet"
    fs, (path,) = resolve_paths(source.config, [name])
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as out:  # same name on retry: rewritten, not duplicated
        pq.write_table(rows, out)
    files = list(source.state.get("files", []))
    if name not in files:
        files.append(name)
    return {**source.state, "files": files}


def append_iceberg(
    source: SourceRef, rows: pa.Table, commit_id: str, aliases: Mapping[str, tuple[str, ...]]
) -> dict[str, Any]:
    from planners.iceberg import lineage_after, load_table, snapshot_properties

    table = load_table(source.config)
    # An earlier try of this commit may have appended already: reuse that snapshot.
    for snap in lineage_after(table, source.state.get("snapshot_id"))[0]:
        if snapshot_properties(snap).get("harness.commit-id") == commit_id:
            return {**source.state, "snapshot_id": snap.snapshot_id}
    schema = table.schema().as_arrow()
    data = _physical(rows, schema.names, aliases)
    missing = [f for f in schema if f.name not in data.column_names]
    for f in missing:
        data = data.append_column(f.name, pa.nulls(data.num_rows, f.type))
    table.append(
        data.select(schema.names).cast(schema),
        snapshot_properties={"harness.commit-id": commit_id, "harness.source": source.name},
    )
    return {**source.state, "snapshot_id": table.current_snapshot().snapshot_id}


def append_postgres(
    source: SourceRef, rows: pa.Table, commit_id: str, aliases: Mapping[str, tuple[str, ...]]
) -> dict[str, Any]:
    import psycopg

    from planners.postgres import table_names
    from planners.postgres_versioning import server_now

    schema, table, _ = table_names(source.config)
    with psycopg.connect(str(source.config["dsn"])) as conn:
        with conn.transaction():
            conn.execute(
                "CREATE TABLE IF NOT EXISTS harness_doput_log (commit_id text, source text, "
                "written_at timestamptz DEFAULT now(), PRIMARY KEY (commit_id, source))"
            )
            done = conn.execute(
                "SELECT 1 FROM harness_doput_log WHERE commit_id = %s AND source = %s",
                (commit_id, source.name),
            ).fetchone()
            if done is None:
                available = [
                    r[0]
                    for r in conn.execute(
                        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
                        (schema, table),
                    )
                ]
                data = _physical(rows, available, aliases)
                cols = ", ".join(quote_ident(c) for c in data.column_names)
                with conn.cursor().copy(
                    f"COPY {quote_ident(schema)}.{quote_ident(table)} ({cols}) FROM STDIN"
                ) as copy:
                    for row in data.to_pylist():
                        copy.write_row(tuple(row.values()))
                conn.execute(
                    "INSERT INTO harness_doput_log (commit_id, source) VALUES (%s, %s)",
                    (commit_id, source.name),
                )
        as_of = server_now(conn)  # after the rows committed; the caller holds the source lock
    return {**source.state, "as_of": as_of}


def append_kafka(
    source: SourceRef, rows: pa.Table, commit_id: str, start: int, *, retry: bool
) -> dict[str, Any]:
    """Produce ``rows`` as JSON. On a ``retry`` of this commit, first scan from ``start`` and
    skip the rows an earlier try already produced."""
    from confluent_kafka import Producer

    from planners.kafka import _config

    servers, topic, partition = _config(source.config)
    present: set[int] = set()
    last = start - 1
    # What an earlier try of this commit produced: scan from its start to the current end.
    for chunk in _scan_tail(source.config, start) if retry else ():
        for m in chunk:
            headers = dict(m.headers() or [])
            if headers.get("harness.commit-id") == commit_id.encode():
                present.add(int(headers["harness.row"]))
            last = max(last, m.offset())
    offsets: dict[int, int] = {}
    errors: list[str] = []

    def report(i: int):  # type: ignore[no-untyped-def]
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                offsets[i] = msg.offset()

        return cb

    producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 5})

    for i, row in enumerate(rows.to_pylist()):
        if i in present:
            continue
        value = json.dumps(row, default=str).encode()
        producer.produce(
            topic,
            value=value,
            partition=partition,
            headers=[("harness.commit-id", commit_id.encode()), ("harness.row", str(i).encode())],
            on_delivery=report(i),
        )
        producer.poll(0)
    if producer.flush(60) != 0 or errors:
        raise Unavailable(
            f"source {source.name!r}: produce to {topic}/{partition} failed: {errors[:3]}"
        )
    high = max([last, *offsets.values()]) + 1
    return {
        **source.state,
        "low": int(source.state.get("low", 0)),
        "high": max(high, int(source.state.get("high", 0))),
    }


def _scan_tail(config: Mapping[str, Any], start: int, idle_s: float = 1.0) -> Any:
    """Messages from ``start`` to the end of the partition (until ``idle_s`` without any)."""
    from confluent_kafka import Consumer, TopicPartition

    from planners.kafka import _config

    servers, topic, partition = _config(config)
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"harness-doput-{time.time_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        # Not the watermark (it may lag): read until the partition stays quiet for idle_s.
        consumer.assign([TopicPartition(topic, partition, start)])
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < idle_s:
            msgs = [m for m in consumer.consume(1000, timeout=0.2) if m.error() is None]
            if msgs:
                idle_since = time.monotonic()
                yield msgs
    finally:
        consumer.close()
