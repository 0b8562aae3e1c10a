"""Iceberg table metadata (format v2) over pinned versions' layouts, written with pyiceberg's own
manifest writers.

- One manifest per source and state (data, and one of position deletes where there are any),
  made once and listed by every version whose source has the same files; entries are EXISTING
  with explicit sequence numbers (every file 1: position deletes name their data files by path,
  so no order between sources is needed, and equality deletes never reach this point — the
  layout resolved them to positions).
- One snapshot per harness version (id ``table_id << 32 | version``), stamped with the version's
  commit time, so the same version always has the same snapshot, and a snapshot never looks
  newer than a query that reads it (DuckDB checks). The metadata of version V lists V and the
  table's other kept versions laid out before it (time travel by snapshot id), newest
  ``history`` of them.
- The schema is the harness schema with its stable column ids; files without field ids are read
  through the ``schema.name-mapping.default`` property (current names and former names).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flight_gateway.core.layout import SliceStore, SourceFiles, VersionLayout
from flight_gateway.core.layout.fits import name_mapping
from flight_gateway.core.layout.ids import arrow_with_ids
from flight_gateway.core.layout.store import Artifact, StoredFile
from flight_gateway.core.layout.version import digest
from planners.kind import ColumnSpec
from planners.layout import POSITION_DELETES, LaidFile

SEQUENCE = 1
SNAPSHOT_FAMILY = "snapshot"
#: The first field id of the name mapping's file columns that are no harness column.
OTHER_IDS = 1_000_000_000
#: pyiceberg's manifest list record fields, in order (format v2).
_MANIFEST_FIELDS = (
    "manifest_path", "manifest_length", "partition_spec_id", "content", "sequence_number",
    "min_sequence_number", "added_snapshot_id", "added_files_count", "existing_files_count",
    "deleted_files_count", "added_rows_count", "existing_rows_count", "deleted_rows_count",
)  # fmt: skip


def snapshot_id(table_id: int, version: int) -> int:
    return (table_id << 32) | version


def version_of(table_id: int, snap_id: int) -> int | None:
    """The harness version of one of this table's snapshot ids, or None."""
    return snap_id & 0xFFFFFFFF if snap_id >> 32 == table_id else None


def iceberg_schema(columns: Sequence[ColumnSpec], schema_id: int) -> Any:
    from pyiceberg.io.pyarrow import pyarrow_to_schema

    schema = pyarrow_to_schema(arrow_with_ids(columns))
    return schema.model_copy(update={"schema_id": schema_id})


@dataclass(frozen=True)
class SnapshotInfo:
    """What one version's snapshot needs in the metadata of any later version."""

    version: int
    committed_at: float
    schema_id: int
    manifest_list: str
    columns: list[list[Any]]  # [field_id, name, type, aliases]
    rows: int
    #: Names of file columns that are no harness column (``FileLayout.other_names``).
    other_names: list[str] = dataclasses.field(default_factory=list)

    def specs(self) -> tuple[ColumnSpec, ...]:
        return tuple(ColumnSpec(int(i), n, t, tuple(a)) for i, n, t, a in self.columns)


class MetadataWriter:
    def __init__(
        self, store: SliceStore, history: int = 16, sweep: Callable[[], Any] = dict
    ) -> None:
        #: ``sweep``: what frees the store's space before a file is refused (``Layouts.sweep``).
        self.store, self.history, self.sweep = store, history, sweep

    def _stored(
        self, tmp: Path, final: Path, key: str, table_id: int, family: str,
        rows: int = 0, state: Any = None,
    ) -> Artifact:  # fmt: skip
        """``tmp`` published as ``final`` and recorded as artifact ``key``, within the store's
        disk budget as slices are (a sweep first, RESOURCE_EXHAUSTED past it): a manifest,
        manifest list and table metadata for every version loaded would otherwise fill the
        disk uncounted. ``tmp`` never outlives the call."""
        token = object()  # its bytes counted for other writes until recorded
        try:
            size = tmp.stat().st_size
            self.store.check_budget(size, self.sweep, token, what="a metadata file")
            self.store.publish(tmp, final)
            stored = StoredFile(str(final), size, rows)
            return self.store.put(key, table_id, family, [stored], state)
        finally:
            self.store.done_writing(token)
            tmp.unlink(missing_ok=True)

    # ------------------------------------------------------------------ manifests

    def _manifest(
        self, layout: VersionLayout, src: SourceFiles, files: Sequence[LaidFile], deletes: bool
    ) -> Any:
        """The manifest of one source's data (or delete) files, made once per their identity."""
        from pyiceberg.manifest import ManifestContent, ManifestFile

        key = digest(src.key, layout.schema_id, "deletes" if deletes else "data")
        with self.store.making(key):
            hit = self.store.get(key)
            if hit is None:
                hit = self._write_manifest(layout, key, files, deletes)
        fields = dict(zip(_MANIFEST_FIELDS, hit.state["record"], strict=True))
        fields["content"] = ManifestContent(fields["content"])
        return ManifestFile.from_args(**fields, partitions=[], key_metadata=None)

    def _write_manifest(
        self, layout: VersionLayout, key: str, files: Sequence[LaidFile], deletes: bool
    ) -> Any:
        from pyiceberg.io.pyarrow import PyArrowFileIO
        from pyiceberg.manifest import ManifestContent, ManifestWriterV2
        from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC

        class DeleteManifestWriter(ManifestWriterV2):
            def content(self) -> ManifestContent:
                return ManifestContent.DELETES

            @property
            def _meta(self) -> dict[str, str]:
                return {**super()._meta, "content": "deletes"}

        made_by = snapshot_id(layout.table_id, layout.version)
        tmp = self.store.temporary(layout.table_id, "metadata", ".avro")
        final = tmp.parent / f"{key[:40]}-m.avro"
        schema = iceberg_schema(layout.columns, layout.schema_id)
        cls = DeleteManifestWriter if deletes else ManifestWriterV2
        writer = cls(UNPARTITIONED_PARTITION_SPEC, schema, PyArrowFileIO().new_output(str(tmp)),
                     made_by, "deflate")  # fmt: skip
        try:
            self._write_entries(writer, files, made_by)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        manifest = writer.to_manifest_file()
        record = [getattr(manifest, n) for n in _MANIFEST_FIELDS]
        # A URI, as the spec has it (Trino resolves a bare path with no file system).
        record[0], record[1] = f"file://{final}", tmp.stat().st_size
        record[3], record[4] = int(record[3]), SEQUENCE
        return self._stored(tmp, final, key, layout.table_id, "manifest", len(files),
                            {"record": record})  # fmt: skip

    @staticmethod
    def _write_entries(writer: Any, files: Sequence[LaidFile], made_by: int) -> None:
        from pyiceberg.manifest import (
            DataFile,
            DataFileContent,
            FileFormat,
            ManifestEntry,
            ManifestEntryStatus,
        )
        from pyiceberg.typedef import Record

        with writer:
            for f in files:
                content = (DataFileContent.POSITION_DELETES if f.content == POSITION_DELETES
                           else DataFileContent.DATA)  # fmt: skip
                data_file = DataFile.from_args(
                    content=content, file_path=f.path, file_format=FileFormat.PARQUET,
                    partition=Record(), record_count=f.record_count, file_size_in_bytes=f.size,
                    column_sizes=_stat(f, "column_sizes"), value_counts=_stat(f, "value_counts"),
                    null_value_counts=_stat(f, "null_value_counts"),
                    nan_value_counts=_stat(f, "nan_value_counts"),
                    lower_bounds=_stat(f, "lower_bounds"), upper_bounds=_stat(f, "upper_bounds"),
                    key_metadata=None, split_offsets=None, equality_ids=None, sort_order_id=None,
                )  # fmt: skip
                writer.existing(ManifestEntry.from_args(
                    status=ManifestEntryStatus.EXISTING, snapshot_id=made_by,
                    sequence_number=SEQUENCE, file_sequence_number=SEQUENCE, data_file=data_file,
                ))  # fmt: skip

    # ------------------------------------------------------------------ snapshots

    def snapshot(self, layout: VersionLayout) -> SnapshotInfo:
        """The version's snapshot (its manifest list), made once."""
        from pyiceberg.io.pyarrow import PyArrowFileIO
        from pyiceberg.manifest import write_manifest_list

        key = digest(layout.table_id, layout.version, [s.key for s in layout.sources], "snap2")
        with self.store.making(key):
            hit = self.store.get(key)
            if hit is not None:
                return SnapshotInfo(**hit.state)
            manifests = []
            for src in layout.sources:
                if src.data:
                    manifests.append(self._manifest(layout, src, src.data, deletes=False))
                if src.deletes:
                    manifests.append(self._manifest(layout, src, src.deletes, deletes=True))
            sid = snapshot_id(layout.table_id, layout.version)
            tmp = self.store.temporary(layout.table_id, "metadata", ".avro")
            final = tmp.parent / f"snap-{sid}-{key[:16]}.avro"
            try:
                with write_manifest_list(2, PyArrowFileIO().new_output(str(tmp)), sid, None,
                                         layout.version + 1, "deflate") as out:  # fmt: skip
                    out.add_manifests(manifests)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            info = SnapshotInfo(
                layout.version,
                layout.committed_at,
                layout.schema_id,
                f"file://{final}",
                [[c.field_id, c.name, c.type, list(c.aliases)] for c in layout.columns],
                sum(f.record_count for s in layout.sources for f in s.data),
                sorted({n for s in layout.sources for n in s.other_names}),
            )
            self._stored(tmp, final, key, layout.table_id, SNAPSHOT_FAMILY, 0, info.__dict__)
            self.store.use(layout.table_id, layout.table, layout.version,
                           [key, *(self._manifest_keys(layout))])  # fmt: skip
            return info

    def _manifest_keys(self, layout: VersionLayout) -> list[str]:
        keys = []
        for src in layout.sources:
            if src.data:
                keys.append(digest(src.key, layout.schema_id, "data"))
            if src.deletes:
                keys.append(digest(src.key, layout.schema_id, "deletes"))
        return keys

    # ------------------------------------------------------------------ table metadata

    def metadata(
        self, layout: VersionLayout, kept: range, location: str
    ) -> tuple[dict[str, Any], str]:
        """(metadata JSON, its file) of ``layout``'s version as the current snapshot, with the
        other versions in ``kept`` already laid out before it in its history."""
        current = self.snapshot(layout)
        earlier = {
            s["version"]: SnapshotInfo(**s)
            for s in self.store.states(layout.table_id, SNAPSHOT_FAMILY)
            if s["version"] in kept and s["version"] < layout.version
        }
        infos = (
            [earlier[v] for v in sorted(earlier)][-(self.history - 1) :] if self.history > 1 else []
        )
        infos.append(current)
        body = _table_metadata(layout, infos, location)
        text = json.dumps(body, sort_keys=True)
        key = digest(text)
        with self.store.making(key):
            hit = self.store.get(key)
            if hit is None:
                tmp = self.store.temporary(layout.table_id, "metadata", ".json")
                final = tmp.parent / f"v{layout.version}-{key[:16]}.metadata.json"
                tmp.write_text(text)
                hit = self._stored(tmp, final, key, layout.table_id, "metadata")
            self.store.use(layout.table_id, layout.table, layout.version, [key])
        return body, f"file://{hit.files[0].path}"


def _stat(f: LaidFile, name: str) -> dict[int, Any]:
    return dict(f.stats.get(name, {}))


def _table_metadata(
    layout: VersionLayout, infos: Sequence[SnapshotInfo], location: str
) -> dict[str, Any]:
    tid = layout.table_id
    schemas: dict[int, Any] = {}
    for info in infos:
        schemas.setdefault(info.schema_id, iceberg_schema(info.specs(), info.schema_id))
    mapping: dict[int, list[str]] = {}
    names_seen: set[str] = set()
    for info in reversed(infos):  # the current version's names first
        for name, fid in name_mapping(info.specs()).items():
            if name not in names_seen:
                names_seen.add(name)
                mapping.setdefault(fid, []).append(name)
    # File columns that are no harness column get ids of their own, far above any column's,
    # that no schema projects: readers skip them.
    others = sorted({n for info in infos for n in info.other_names} - names_seen)
    for i, name in enumerate(others):
        mapping[OTHER_IDS + i] = [name]
    snapshots, log = [], []
    parent = None
    for info in infos:
        sid = snapshot_id(tid, info.version)
        ms = int(info.committed_at * 1000)
        snap: dict[str, Any] = {
            "snapshot-id": sid, "sequence-number": info.version + 1, "timestamp-ms": ms,
            "manifest-list": info.manifest_list, "schema-id": info.schema_id,
            "summary": {"operation": "overwrite", "harness.version": str(info.version),
                        "total-records": str(info.rows)},
        }  # fmt: skip
        if parent is not None:
            snap["parent-snapshot-id"] = parent
        snapshots.append(snap)
        log.append({"snapshot-id": sid, "timestamp-ms": ms})
        parent = sid
    current = snapshot_id(tid, layout.version)
    last_id = max((i for s in schemas.values() for i in _ids(s)), default=0)
    return {
        "format-version": 2,
        "table-uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"harness-table-{tid}")),
        "location": location,
        "last-sequence-number": layout.version + 1,
        "last-updated-ms": int(layout.committed_at * 1000),
        "last-column-id": last_id,
        "current-schema-id": layout.schema_id,
        "schemas": [json.loads(s.model_dump_json(by_alias=True)) for s in schemas.values()],
        "default-spec-id": 0,
        "partition-specs": [{"spec-id": 0, "fields": []}],
        "last-partition-id": 999,
        "default-sort-order-id": 0,
        "sort-orders": [{"order-id": 0, "fields": []}],
        "properties": {
            "schema.name-mapping.default": json.dumps(
                [{"field-id": fid, "names": names} for fid, names in sorted(mapping.items())]
            ),
            "harness.table-id": str(tid),
            "harness.version": str(layout.version),
        },
        "current-snapshot-id": current,
        "refs": {"main": {"snapshot-id": current, "type": "branch"}},
        "snapshots": snapshots,
        "snapshot-log": log,
        "metadata-log": [],
        "statistics": [],
        "partition-statistics": [],
    }


def _ids(schema: Any) -> list[int]:
    from pyiceberg.schema import index_by_id

    return list(index_by_id(schema))
