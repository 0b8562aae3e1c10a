"""Maintenance that respects pins: nothing a retained harness version reads is ever removed.

One pass (``run_once``) over every table of a catalog:

1. **Version retention** by table properties ``retention.keep_last`` (keep the newest N
   versions) and ``retention.max_age_s`` (forget versions older than that, the current one is
   always kept). Every kept version still reads exactly as before (``Catalog.expire_versions``).
2. **Each kind's own housekeeping** (the ``Maintains`` capability), given every source of that
   kind that a retained version pins: the ``files`` kind deletes files the harness wrote under a
   root that no pin lists and that are older than ``grace_s``; the ``iceberg`` kind expires
   snapshots older than the oldest pinned one (metadata only; later snapshots stay, so ``since``
   reads keep an unbroken lineage); the ``kafka`` kind reports messages a pin needs that topic
   retention already deleted (logged as an error, exported as
   ``harness_pinned_rows_lost``); the ``postgres`` kind replaces versioning triggers that an
   older release installed (``upgraded``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flight_gateway.catalog import Catalog, TableSnapshot
from flight_gateway.catalog.config import resolve_config
from planners import registry
from planners.kind import Maintains, Pinned, SourceRef

log = logging.getLogger(__name__)


@dataclass
class Report:
    expired_versions: dict[str, int] = field(default_factory=dict)
    deleted_files: list[str] = field(default_factory=list)
    expired: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)
    upgraded: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "expired_versions": self.expired_versions,
            "deleted_files": self.deleted_files,
            "expired": self.expired,
            "lost": {k: v for k, v in self.lost.items() if v},
            "upgraded": self.upgraded,
        }

    def add(self, done: Mapping[str, Any]) -> None:
        self.deleted_files += list(done.get("deleted_files", []))
        self.expired.update(done.get("expired", {}))
        self.lost.update(done.get("lost", {}))
        self.upgraded += list(done.get("upgraded", []))


def retained(catalog: Catalog, table: str) -> list[TableSnapshot]:
    """Every version of ``table`` still readable, oldest first."""
    return [catalog.describe(table, version=h.version) for h in reversed(catalog.history(table))]


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


def _pinned_by_kind(snaps: list[TableSnapshot]) -> dict[str, list[Pinned]]:
    out: dict[str, list[Pinned]] = {}
    for snap in snaps:
        for s in snap.sources:
            ref = SourceRef(s.name, s.kind, resolve_config(s.config), s.partition, s.state)
            out.setdefault(s.kind, []).append(Pinned(snap.table, snap.version, ref))
    return out


def run_once(catalog: Catalog, *, grace_s: float = 3600.0) -> Report:
    from flight_gateway.server import metrics

    report = Report()
    everything: list[TableSnapshot] = []
    for table in catalog.list_tables():
        _apply_retention(catalog, table, catalog.describe(table).properties, report)
        everything += retained(catalog, table)
    for kind_name, pinned in _pinned_by_kind(everything).items():
        kind = registry.get_kind(kind_name)
        if isinstance(kind, Maintains):
            report.add(kind.maintain(pinned, grace_s))
    for key, n in report.lost.items():
        table, _, source = key.partition("/")
        metrics.PINNED_LOST.labels(table, source).set(n)
        if n:
            log.error("%s: %d messages a pinned version needs were deleted by the source", key, n)
    for path in report.deleted_files:
        log.info("deleted unreferenced file %s", path)
    return report
