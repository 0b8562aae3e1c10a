"""Maintenance that respects pins: nothing a retained harness version reads is ever removed.

One pass (``run_once``) over every table of a catalog:

1. **Version retention** by table properties ``retention.keep_last`` (keep the newest N
   versions) and ``retention.max_age_s`` (forget versions older than that, the current one is
   always kept). Every kept version still reads exactly as before (``Catalog.expire_versions``).
2. **Each kind's own housekeeping** (the ``Maintains`` capability), given every source of that
   kind that a retained version pins: the ``files`` kind deletes files this catalog wrote under
   a root (named with its tag) that no pin lists and that are older than ``grace_s``; the
   ``iceberg`` kind expires
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

from flight_gateway.catalog import Catalog
from flight_gateway.core.secrets import SecretResolver
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


def retained_pins(
    catalog: Catalog,
    table: str,
    secrets: SecretResolver | None = None,
    clean_untagged: bool = False,
) -> list[Pinned]:
    """Every source state some retained version reads, in one query: the state rows in force
    at a version in ``[min_version, current]`` (one ``describe`` per retained version made
    maintenance quadratic in history: 63 s at 3,000 versions)."""
    from sqlalchemy import func, or_, select

    from flight_gateway.catalog.db import read_tx, source_states, sources
    from flight_gateway.catalog.in_force import state_in_force
    from flight_gateway.catalog.queries import table_row

    with read_tx(catalog.engine) as conn:
        t = table_row(conn, table)
        lo = int(t.min_version)
        alive = or_(sources.c.removed_version.is_(None), sources.c.removed_version > lo)
        before_removal = or_(
            sources.c.removed_version.is_(None), source_states.c.version < sources.c.removed_version
        )
        rows = conn.execute(
            select(
                sources.c.name,
                sources.c.kind,
                sources.c.config,
                sources.c.partition,
                source_states.c.state,
                source_states.c.version,
            )
            .join(source_states, source_states.c.source_id == sources.c.id)
            .where(
                sources.c.table_id == t.id,
                alive,
                before_removal,
                # from the state in force at the oldest kept version (none: every state)
                source_states.c.version >= func.coalesce(state_in_force(lo), -1),
            )
        ).all()
    resolver = secrets or SecretResolver()
    return [
        Pinned(
            table,
            max(lo, int(r.version)),
            SourceRef(
                r.name,
                r.kind,
                resolver.resolve(r.config, where=f"source {r.name!r} config", table=table),
                r.partition,
                r.state,
            ),
            catalog.catalog_tag,
            clean_untagged,
        )
        for r in rows
    ]


def run_once(
    catalog: Catalog,
    *,
    grace_s: float = 3600.0,
    secrets: SecretResolver | None = None,
    clean_untagged: bool = False,
) -> Report:
    """One maintenance pass over every table; ``secrets``: the gateway config's resolver
    (``${NAME}`` in source configs resolve under its allow-list, as when serving);
    ``clean_untagged``: the files roots are this catalog's alone, so unused files a release
    before catalog tags wrote there are deleted too (``maintain --clean-untagged``)."""
    from flight_gateway.core import metrics

    report = Report()
    by_kind: dict[str, list[Pinned]] = {}
    for table in catalog.list_tables():
        _apply_retention(catalog, table, catalog.describe(table).properties, report)
        for p in retained_pins(catalog, table, secrets, clean_untagged):
            by_kind.setdefault(p.source.kind, []).append(p)
    for kind_name, pinned in by_kind.items():
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
