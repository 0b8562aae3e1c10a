"""Optimistic rewrites of an Iceberg source (DESIGN §18), as Iceberg's own ``RewriteFiles``
validates them: the data files the rewrite read are replaced by its files in one ``overwrite``
snapshot, and files appended since it read stay. A snapshot since then that deleted or
replaced anything (row deletes, an overwrite, another rewrite) is a conflict: its deletes
would not apply to the rewritten rows (their sequence number is newer), so the rewrite must
read again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flight_gateway.protocol import operations as ops
from flight_gateway.protocol.errors import Conflict, InvalidArgument

#: Snapshot operations that only add data files (Iceberg's ``append``).
_APPENDS = {"append"}


def _appends_only(snaps: Sequence[Any]) -> Any | None:
    """The first snapshot of ``snaps`` that did more than append data files, or None."""
    for snap in snaps:
        summary = snap.summary
        op = getattr(getattr(summary, "operation", None), "value", None)
        props = dict(summary.additional_properties) if summary is not None else {}
        if op not in _APPENDS or int(props.get("added-delete-files", "0") or 0):
            return snap
    return None


def _data_files(table: Any, snapshot_id: int | None) -> list[Any]:
    """The live data files of a snapshot (pyiceberg's ``plan_files`` refuses tables with
    equality deletes; the manifests list them all the same)."""
    from pyiceberg.manifest import ManifestContent

    from planners.iceberg_manifests import entries

    snap = table.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
    if snap is None:
        return []
    return [e.data_file for m in snap.manifests(table.io) if m.content == ManifestContent.DATA
            for e in entries(table.io, m)]  # fmt: skip


def _named(name: str, data_files: list[Any], paths: Sequence[str]) -> list[Any]:
    """The data files at ``paths`` (a bin-pack rewrite replaces those only)."""
    wanted = set(paths)
    named = [f for f in data_files if f.file_path in wanted]
    if len(named) != len(wanted):
        missing = sorted(wanted - {f.file_path for f in named})
        raise InvalidArgument(
            f"source {name!r}: {len(missing)} of the files to replace ({missing[0]!r}, ...) were "
            "not data files of the snapshot the rewrite read"
        )
    return named


def rewrite(
    table: Any,
    name: str,
    replaced: int | None,
    files: Sequence[str],
    commit_id: str,
    lineage_after: Any,
    only: Sequence[str] | None = None,
) -> int | None:
    """Commit ``files`` in place of the data files of snapshot ``replaced`` (``only``: those of
    them at these paths); the new current snapshot id. ``lineage_after(table, since)``: the
    snapshots after ``since``."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table import TableProperties, _parquet_files_to_data_files

    from planners.iceberg_tx import transaction

    since, on_lineage = lineage_after(table, replaced)
    if not on_lineage:
        raise Conflict(f"source {name!r}: snapshot {replaced} is no longer an ancestor of the "
                       "table's current snapshot: read the source again")  # fmt: skip
    other = _appends_only(since)
    if other is not None:
        raise Conflict(
            f"source {name!r}: snapshot {other.snapshot_id} changed rows this rewrite read "
            "(not an append): read the source again"
        )
    props = {ops.SNAP_COMMIT_ID: commit_id, ops.SNAP_RELOCATION: "true"}
    old = _data_files(table, replaced)
    if only is not None:
        old = _named(name, old, only)
    try:
        with transaction(table) as tx:
            if tx.table_metadata.name_mapping() is None:  # as pyiceberg's add_files sets it
                mapping = tx.table_metadata.schema().name_mapping.model_dump_json()
                tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})
            with tx.update_snapshot(snapshot_properties=props).overwrite() as ow:
                for data_file in old:
                    ow.delete_data_file(data_file)
                new = _parquet_files_to_data_files(tx.table_metadata, list(files), table.io)
                for data_file in new:
                    ow.append_data_file(data_file)
    except CommitFailedException as e:  # written to outside the harness meanwhile
        raise Conflict(f"source {name!r}: the Iceberg commit of the rewrite failed: {e}") from e
    except ValueError as e:  # the files do not fit the table (types, names)
        raise InvalidArgument(f"source {name!r}: cannot adopt files: {e}") from e
    table.refresh()
    snap = table.current_snapshot()
    return snap.snapshot_id if snap else None
