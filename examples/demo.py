"""`make demo`: the harness catalog on embedded defaults (a SQLite file under ./demo-data)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from flight_gateway.catalog import Catalog

log = logging.getLogger("demo")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root = Path("demo-data")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    cat = Catalog(f"sqlite:///{root / 'catalog.db'}")
    cat.create_table(
        "logs",
        [{"name": "id", "type": "int64"}, {"name": "level", "type": "string"}],
        partition_by=["level"],
    )
    cat.commit(
        "logs",
        "add-sources",
        add_sources=[
            {"name": "kafka-0", "kind": "kafka", "state": {"low": 0, "high": 0}},
            {"name": "iceberg", "kind": "iceberg", "state": {"snapshot_id": None}},
        ],
    )
    cat.commit("logs", "ingest-1", updates=[{"source": "kafka-0", "state": {"low": 0, "high": 500}}])
    grant = cat.lock("logs", ["kafka-0", "iceberg"], owner="mover", ttl_s=30)
    moved = cat.commit(
        "logs",
        "flush-1",
        lock_id=grant.lock_id,
        updates=[
            {"source": "iceberg", "state": {"snapshot_id": 1001}},
            {"source": "kafka-0", "state": {"low": 500, "high": 500}},
        ],
    )
    cat.unlock(grant.lock_id)
    for v in (moved.version - 1, moved.version):
        snap = cat.describe("logs", version=v)
        log.info("version %d: %s", v, {s.name: dict(s.state) for s in snap.sources})
    for h in cat.history("logs"):
        log.info("  v%d %s %s", h.version, h.commit_id, h.summary.get("updated"))
    cat.close()


if __name__ == "__main__":
    main()
