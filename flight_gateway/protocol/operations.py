"""Names writers leave behind: commit operations and the properties of lakehouse snapshots.

Commit summaries (``harness.commit`` ``summary``, kept in history) name their ``operation`` and
say whether the commit *relocates* rows (moves or rewrites them without adding any: movers,
compaction). Streaming reads (``since``) skip relocations, so a row is delivered once, when it is
first written, wherever it lives later.

Snapshots a writer makes in a lakehouse table (Iceberg today) carry properties so that a retry or
a restarted mover can find them again; the keys are defined here, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# ---------------------------------------------------------------- commit summaries

OPERATION = "operation"
#: ``summary["relocation"] = True``: the commit moves or rewrites rows and adds none.
RELOCATION = "relocation"

DOPUT = "doput"
MOVE = "move"
DOPUT_INTENT = "doput-intent"
SPARK_APPEND = "spark-append"
SPARK_OVERWRITE = "spark-overwrite"
COMPACTION = "compaction"
KAFKA_INGEST = "kafka-ingest"
PG_UPSERT = "pg-upsert"
EVOLVE_SCHEMA = "evolve_schema"

# Catalogs written before the ``relocation`` flag existed name relocations only by operation.
_LEGACY_RELOCATIONS = frozenset(
    {
        "compaction",
        "kafka-to-iceberg",
        "kafka-to-postgres",
        "postgres-to-iceberg",
        "postgres-to-ducklake",
        "kafka-flush",
        "pg-cold-move",
    }
)


def relocation_summary(operation: str, **details: Any) -> dict[str, Any]:
    """The summary of a commit that moves or rewrites rows."""
    return {OPERATION: operation, RELOCATION: True, **details}


def is_relocation(summary: Mapping[str, Any]) -> bool:
    return summary.get(RELOCATION) is True or summary.get(OPERATION) in _LEGACY_RELOCATIONS


# ---------------------------------------------------------------- snapshot properties

#: The harness commit id an append belongs to; a retry of that commit reuses the snapshot.
SNAP_COMMIT_ID = "harness.commit-id"
#: ``"true"``: the snapshot moves or rewrites rows (a mover's append, a compaction).
SNAP_RELOCATION = "harness.relocation"
#: Movers: the harness table and the hot source the rows came from, with the moved range.
SNAP_TABLE = "harness.table"
SNAP_MOVED_FROM = "harness.moved-from"
SNAP_LOW = "harness.low"
SNAP_HIGH = "harness.high"
SNAP_ROWS = "harness.rows"
#: Compaction: the job id.
SNAP_COMPACTION = "harness.compaction"
# Before these keys, movers and DoPut both wrote ``harness.source`` (the mover's hot source, or
# the DoPut target). A snapshot with it and without a commit id is an old mover's.
_LEGACY_SOURCE = "harness.source"


def snapshot_is_relocation(props: Mapping[str, str]) -> bool:
    if props.get(SNAP_RELOCATION) == "true" or SNAP_COMPACTION in props:
        return True
    return _LEGACY_SOURCE in props and SNAP_COMMIT_ID not in props


def moved_from(props: Mapping[str, str]) -> str | None:
    """The hot source a mover's snapshot came from (None for other snapshots)."""
    if SNAP_MOVED_FROM in props:
        return props[SNAP_MOVED_FROM]
    if _LEGACY_SOURCE in props and SNAP_COMMIT_ID not in props:
        return props[_LEGACY_SOURCE]
    return None


def write_properties(commit_id: str, relocation: bool = False, table: str = "") -> dict[str, str]:
    """Snapshot properties of a harness write: its commit id (a retry finds it), the harness
    table it writes for (when given: a write no commit of that table published is found as
    abandoned, never another table's) and, for the rows of a move, the relocation mark
    streaming reads skip."""
    props = {SNAP_COMMIT_ID: commit_id}
    if table:
        props[SNAP_TABLE] = table
    if relocation:
        props[SNAP_RELOCATION] = "true"
    return props


def mover_properties(table: str, hot: str, **details: str) -> dict[str, str]:
    """Snapshot properties of a mover's append (found again by ``moved_from``)."""
    return {
        SNAP_TABLE: table,
        SNAP_MOVED_FROM: hot,
        SNAP_RELOCATION: "true",
        **{f"harness.{k}": v for k, v in details.items()},
    }


#: Columns a source computes when it is read (DESIGN §4): never stored, so never moved.
READ_TIME_COLUMNS = frozenset(
    {"_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_kafka_key", "_source"}
)
