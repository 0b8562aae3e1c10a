"""Maintenance that respects pins: nothing a retained harness version reads is ever removed.

One pass (``run_once``) over every table of a catalog:

1. **Version retention** by table properties ``retention.keep_last`` (keep the newest N
   versions) and ``retention.max_age_s`` (forget versions older than that, the current one is
   always kept). Every kept version still reads exactly as before (``Catalog.expire_versions``).
2. **Files cleanup** for ``files`` sources with a ``root``: files the harness wrote there
   (``harness-*`` DoPut files and ``spark-*`` staging directories' files) that no retained
   version of any source on that root lists, and that are older than ``grace_s`` (a write in
   flight has not committed yet), are deleted. Files the harness did not write are never touched.
3. **Iceberg snapshot expiry**: snapshots older than the oldest snapshot any retained harness
   version pins, on an Iceberg table the harness reads, are expired (metadata only, as pyiceberg
   does; branch and tag heads are protected). Snapshots after that one stay, so streaming reads
   between retained versions still walk an unbroken lineage. Orphan data files of Iceberg tables
   are not deleted: pyiceberg 0.12 has no safe orphan-file removal.
4. **Kafka retention guard**: a Kafka source whose pinned ``low`` is below its topic
   partition's earliest offset has lost rows to topic retention; that is logged as an error and
   exported as ``harness_kafka_low_below_earliest``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flight_gateway.catalog import Catalog, TableSnapshot
from flight_gateway.catalog.config import resolve_config

log = logging.getLogger(__name__)

HARNESS_FILE_PREFIXES = ("harness-", "spark-")


@dataclass
class Report:
    expired_versions: dict[str, int] = field(default_factory=dict)
    deleted_files: list[str] = field(default_factory=list)
    expired_snapshots: dict[str, int] = field(default_factory=dict)
    kafka_lost: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "expired_versions": self.expired_versions,
            "deleted_files": self.deleted_files,
            "expired_snapshots": self.expired_snapshots,
            "kafka_lost": self.kafka_lost,
        }


def retained(catalog: Catalog, table: str) -> list[TableSnapshot]:
    """Every version of ``table`` still readable, oldest first."""
    current = catalog.current_version(table)
    versions = [h.version for h in catalog.history(table)]
    return [catalog.describe(table, version=v) for v in sorted(versions) if v <= current]


def _apply_retention(
    catalog: Catalog, table: str, props: Mapping[str, Any], report: Report
) -> None:
    keep = props.get("retention.keep_last")
    age = props.get("retention.max_age_s")
    if keep is None and age is None:
        return
    n = catalog.expire_versions(
        table,
        keep_last=int(keep) if keep is not None else None,
        before=time.time() - float(age) if age is not None else None,
    )
    if n:
        report.expired_versions[table] = n


def _file_roots(snaps: Iterable[TableSnapshot]) -> dict[str, set[str]]:
    """root -> every file name a retained version of a ``files`` source on it lists."""
    roots: dict[str, set[str]] = {}
    for snap in snaps:
        for s in snap.sources:
            root = s.config.get("root") if s.kind == "files" else None
            if isinstance(root, str) and "://" not in root:
                config = resolve_config(s.config)
                roots.setdefault(str(config["root"]), set()).update(s.state.get("files", []))
    return roots


def _clean_root(root: str, keep: set[str], grace_s: float, report: Report) -> None:
    now = time.time()
    keep_abs = {os.path.normpath(os.path.join(root, f)) for f in keep}
    for dirpath, _dirs, files in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        for name in files:
            path = os.path.normpath(os.path.join(dirpath, name))
            first = (name if rel_dir == "." else rel_dir).split(os.sep)[0]
            if not first.startswith(HARNESS_FILE_PREFIXES) or path in keep_abs:
                continue
            try:
                if now - os.path.getmtime(path) < grace_s:
                    continue  # maybe a write that has not committed yet
                os.remove(path)
            except FileNotFoundError:
                continue
            report.deleted_files.append(path)
            log.info("deleted unreferenced file %s", path)


def _iceberg_pins(snaps: Iterable[TableSnapshot]) -> dict[str, tuple[Mapping[str, Any], set[int]]]:
    pins: dict[str, tuple[Mapping[str, Any], set[int]]] = {}
    for snap in snaps:
        for s in snap.sources:
            if s.kind != "iceberg" or s.state.get("snapshot_id") is None:
                continue
            key = f"{s.config.get('catalog')}/{s.config.get('identifier')}"
            pins.setdefault(key, (s.config, set()))[1].add(int(s.state["snapshot_id"]))
    return pins


def _expire_iceberg(key: str, config: Mapping[str, Any], pinned: set[int], report: Report) -> None:
    from planners.iceberg import load_table

    table = load_table(resolve_config(config))
    meta = table.metadata
    stamps = {s.snapshot_id: s.timestamp_ms for s in meta.snapshots}
    oldest = min((stamps[i] for i in pinned if i in stamps), default=None)
    current = table.current_snapshot()
    if oldest is None:
        return
    doomed = [
        i
        for i, ts in stamps.items()
        if ts < oldest and i not in pinned and (current is None or i != current.snapshot_id)
    ]
    if doomed:
        table.maintenance.expire_snapshots().by_ids(doomed).commit()
        report.expired_snapshots[key] = len(doomed)
        log.info("expired %d Iceberg snapshots of %s", len(doomed), config.get("identifier"))


def _kafka_guard(snap: TableSnapshot, report: Report) -> None:
    from flight_gateway.server import metrics
    from planners.kafka.config import KafkaConfig

    for s in snap.sources:
        if s.kind != "kafka":
            continue
        config = KafkaConfig.parse(resolve_config(s.config), where=f"source {s.name!r}")
        earliest = _earliest_offset(config)
        lost = max(0, earliest - int(s.state.get("low", 0))) if earliest is not None else 0
        metrics.KAFKA_BEHIND.labels(snap.table, s.name).set(lost)
        if lost:
            report.kafka_lost[f"{snap.table}/{s.name}"] = lost
            log.error(
                "table %s source %s: %d messages below the topic's earliest offset are gone "
                "(topic retention ran ahead of the movers)",
                snap.table,
                s.name,
                lost,
            )


def _earliest_offset(config: Any) -> int | None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": config.bootstrap_servers, "group.id": "harness-maintenance"}
    )
    try:
        low, _high = consumer.get_watermark_offsets(
            TopicPartition(config.topic, config.partition), timeout=10
        )
        return int(low)
    except Exception as e:  # an unreachable broker must not stop the other checks
        log.warning("cannot read earliest offset of %s/%d: %s", config.topic, config.partition, e)
        return None
    finally:
        consumer.close()


def run_once(catalog: Catalog, *, grace_s: float = 3600.0) -> Report:
    report = Report()
    everything: list[TableSnapshot] = []
    for table in catalog.list_tables():
        _apply_retention(catalog, table, catalog.describe(table).properties, report)
        snaps = retained(catalog, table)
        everything += snaps
        _kafka_guard(snaps[-1], report)
    for root, keep in _file_roots(everything).items():
        _clean_root(root, keep, grace_s, report)
    for key, (config, pinned) in _iceberg_pins(everything).items():
        _expire_iceberg(key, config, pinned, report)
    return report
