"""Merge-on-read writes for Iceberg (issue 25): data files plus delete files in ONE snapshot.

pyiceberg 0.12 writes data files and *reads* position deletes, but it cannot write delete files
and refuses to read equality deletes. Upserts and deletes by primary key still need to land
atomically, so this module writes the delete files itself and commits them with the new data
files through one fast append whose manifest list holds a *data* manifest and a *delete*
manifest (ENVIRONMENT.md, "Equality deletes"). A delete file put into a data manifest would be
read as data rows, which is why delete files get their own manifest writer.

Semantics (Iceberg spec, "Scan Planning"), which give upserts for free:

- an equality delete applies to data files whose data sequence number is strictly LOWER than its
  own, so rows added in the same snapshot survive: delete the key, add the new row;
- a position delete applies to data files whose data sequence number is lower than OR EQUAL to
  its own.

pyiceberg internals relied on (pin them when upgrading; ``tests/planners/test_iceberg_deletes.py``
exercises each one):

- ``pyiceberg.table.update.snapshot._FastAppendFiles``, subclassed: ``_manifests``,
  ``_existing_manifests``, ``_process_manifests``, ``_validate_concurrency``,
  ``new_manifest_writer``, ``new_manifest_output``, ``_added_data_files``, ``_operation``,
  ``_snapshot_id``, ``_compression``, ``_transaction``;
- ``pyiceberg.manifest.ManifestWriterV2``, subclassed: ``content()`` and ``_meta``;
- ``pyiceberg.io.pyarrow._dataframe_to_data_files`` and ``_check_pyarrow_schema_compatible``
  (what ``Transaction.append`` uses), and ``schema_to_pyarrow``, ``compute_statistics_plan``,
  ``parquet_path_to_id_mapping``, ``data_file_statistics_from_parquet_metadata`` for the delete
  files' metrics.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.exceptions import ValidationException
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    _check_pyarrow_schema_compatible,
    _dataframe_to_data_files,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV2,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.typedef import Record
from pyiceberg.types import DoubleType, FloatType, LongType, NestedField, StringType

from planners.iceberg_tx import transaction

logger = logging.getLogger(__name__)

__all__ = ["write_changes", "write_position_deletes"]

# Reserved field ids of a position delete file (Iceberg spec, "Position Delete Files").
POS_DELETE_SCHEMA = Schema(
    NestedField(2147483546, "file_path", StringType(), required=True),
    NestedField(2147483545, "pos", LongType(), required=True),
)


def write_changes(
    table: Table,
    *,
    data: pa.Table | None,
    deletes: pa.Table | None,
    equality_ids: Sequence[int],
    snapshot_properties: Mapping[str, str] | None = None,
) -> int:
    """Add ``data`` and equality-delete the keys in ``deletes`` in one snapshot; return its id.

    ``deletes`` holds only the key columns (named as in the table schema, one column per id in
    ``equality_ids``). A key in ``deletes`` removes every row with that key written by EARLIER
    snapshots; rows in ``data`` are never deleted by their own commit. So an upsert passes the
    new rows as ``data`` and their keys (plus any keys to drop) as ``deletes``. Two rows with
    the same key in one ``data`` both stay visible: de-duplicate before calling.
    """
    _require_v2_unpartitioned(table, "equality deletes")
    key_schema = _key_schema(table.schema(), equality_ids)
    if not _has_rows(data) and not _has_rows(deletes):
        raise ValueError("write_changes needs rows to add or keys to delete")
    write_uuid = uuid.uuid4()
    files: list[DataFile] = []
    try:
        if data is not None and data.num_rows:
            files.extend(_write_data_files(table, data, write_uuid))
        if deletes is not None and deletes.num_rows:
            files.append(_write_equality_delete_file(table, deletes, key_schema, write_uuid))
        return _commit(table, files, snapshot_properties)
    except Exception:
        _remove_unless_committed(table, files)
        raise


def write_position_deletes(
    table: Table,
    positions: Mapping[str, Sequence[int]],
    *,
    data: pa.Table | None = None,
    snapshot_properties: Mapping[str, str] | None = None,
) -> int:
    """Delete rows by (data file path, 0-based row position), optionally adding ``data``, in one
    snapshot; return its id.

    Every path must be a live data file of the current snapshot: a position delete pointing at a
    file compacted away would silently delete nothing. pyiceberg reads these deletes too.
    """
    _require_v2_unpartitioned(table, "position deletes")
    wanted = {path: sorted(set(rows)) for path, rows in positions.items() if rows}
    if not wanted and not _has_rows(data):
        raise ValueError("write_position_deletes needs positions or rows to add")
    missing = set(wanted) - _data_file_paths(table.current_snapshot(), table.io)
    if missing:
        raise ValueError(f"not live data files of {table.name()}: {sorted(missing)}")
    write_uuid = uuid.uuid4()
    files: list[DataFile] = []
    try:
        if data is not None and data.num_rows:
            files.extend(_write_data_files(table, data, write_uuid))
        if wanted:
            files.append(_write_position_delete_file(table, wanted, write_uuid))
        return _commit(table, files, snapshot_properties, referenced=set(wanted))
    except Exception:
        _remove_unless_committed(table, files)
        raise


# --- validation ------------------------------------------------------------------------------


def _has_rows(rows: pa.Table | None) -> bool:
    return rows is not None and rows.num_rows > 0


def _require_v2_unpartitioned(table: Table, what: str) -> None:
    """Delete files exist from format version 2 on; v3 wants deletion vectors instead of position
    delete files, and a partitioned table needs a partition value on every delete file."""
    version = table.metadata.format_version
    if version != 2:
        raise ValueError(
            f"{what} need an Iceberg format-version 2 table; {table.name()} is version {version}"
        )
    if not table.spec().is_unpartitioned():
        raise NotImplementedError(
            f"{what} on a partitioned table ({table.name()}, spec {table.spec()}) are not "
            "supported: each delete file would need the partition of the rows it deletes"
        )


def _key_schema(schema: Schema, equality_ids: Sequence[int]) -> Schema:
    """The equality delete file's schema: the key fields with their table field ids.

    Keys must be distinct top-level primitive fields and not float/double (Iceberg's rule for
    identifier fields: NaN and -0.0 make equality ambiguous)."""
    if not equality_ids or len(set(equality_ids)) != len(equality_ids):
        raise ValueError(f"equality_ids must be distinct field ids, got {list(equality_ids)}")
    top_level = {f.field_id: f for f in schema.fields}
    fields = []
    for field_id in equality_ids:
        field = top_level.get(field_id)
        if field is None:
            raise ValueError(f"equality id {field_id} is not a top-level field of {schema}")
        floating = isinstance(field.field_type, FloatType | DoubleType)
        if not field.field_type.is_primitive or floating:
            raise ValueError(f"key field {field.name!r} must be primitive and not float/double")
        fields.append(field)
    return Schema(*fields)


def _data_file_paths(snapshot: Snapshot | None, io: FileIO) -> set[str]:
    """Paths of the live data files of ``snapshot``, read from its DATA manifests directly
    (pyiceberg's scan planning refuses a table with equality deletes)."""
    if snapshot is None:
        return set()
    return {
        entry.data_file.file_path
        for manifest in snapshot.manifests(io)
        if manifest.content == ManifestContent.DATA
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=True)
    }


# --- writing files ---------------------------------------------------------------------------


def _write_data_files(table: Table, data: pa.Table, write_uuid: uuid.UUID) -> list[DataFile]:
    """Data files exactly as ``Transaction.append`` writes them (names, metrics, file sizes)."""
    _check_pyarrow_schema_compatible(
        table.schema(), provided_schema=data.schema, format_version=table.metadata.format_version
    )
    files = list(
        _dataframe_to_data_files(
            table_metadata=table.metadata, df=data, io=table.io, write_uuid=write_uuid
        )
    )
    logger.debug("wrote %d data file(s) for %s", len(files), table.name())
    return files


def _write_equality_delete_file(
    table: Table, deletes: pa.Table, key_schema: Schema, write_uuid: uuid.UUID
) -> DataFile:
    """One Parquet file of key values whose columns carry their field ids (``PARQUET:field_id``),
    so readers match them by id, not by name (a key column may be renamed later)."""
    names = [f.name for f in key_schema.fields]
    if sorted(deletes.column_names) != sorted(names):
        raise ValueError(
            f"deletes must have exactly the key columns {names}, got {deletes.column_names}"
        )
    return _write_delete_file(
        table,
        _to_file_schema(deletes.select(names), key_schema),
        key_schema,
        name=f"00000-0-{write_uuid}-eq-deletes.parquet",
        content=DataFileContent.EQUALITY_DELETES,
        equality_ids=[f.field_id for f in key_schema.fields],
    )


def _write_position_delete_file(
    table: Table, positions: Mapping[str, Sequence[int]], write_uuid: uuid.UUID
) -> DataFile:
    """One Parquet file of (file_path, pos), sorted by both as the spec requires."""
    paths = sorted(positions)
    rows = pa.table(
        {
            "file_path": [p for p in paths for _ in positions[p]],
            "pos": [pos for p in paths for pos in positions[p]],
        }
    )
    return _write_delete_file(
        table,
        _to_file_schema(rows, POS_DELETE_SCHEMA),
        POS_DELETE_SCHEMA,
        name=f"00000-0-{write_uuid}-pos-deletes.parquet",
        content=DataFileContent.POSITION_DELETES,
        equality_ids=None,
    )


def _to_file_schema(rows: pa.Table, schema: Schema) -> pa.Table:
    """Cast to the Iceberg types, with the field ids as Arrow field metadata."""
    target = schema_to_pyarrow(schema, include_field_ids=True)
    try:
        return rows.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
        raise ValueError(f"delete rows do not fit {target}: {e}") from e


def _write_delete_file(
    table: Table,
    rows: pa.Table,
    schema: Schema,
    *,
    name: str,
    content: DataFileContent,
    equality_ids: list[int] | None,
) -> DataFile:
    """Write ``rows`` as Parquet at a data location of the table and describe it as a DataFile
    (record count, size, column metrics) the way pyiceberg describes its own data files."""
    path = table.location_provider().new_data_location(data_file_name=name)
    with (
        table.io.new_output(path).create(overwrite=False) as stream,
        pq.ParquetWriter(stream, rows.schema) as writer,
    ):
        writer.write_table(rows)
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=writer.writer.metadata,
        stats_columns=compute_statistics_plan(schema, table.metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    logger.debug("wrote %s (%d rows) for %s", path, rows.num_rows, table.name())
    return DataFile.from_args(
        content=content,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        file_size_in_bytes=len(table.io.new_input(path)),
        sort_order_id=None,
        spec_id=table.metadata.default_spec_id,
        equality_ids=equality_ids,
        key_metadata=None,
        **stats.to_serialized_dict(),
    )


def _remove_unless_committed(table: Table, files: Sequence[DataFile]) -> None:
    """Delete the files written for a commit that did not land, leaving no orphans behind.

    Only files the refreshed table does not reference: an error after a successful commit (say,
    a lost response) must never delete live files."""
    if not files:
        return
    try:
        table.refresh()
        live = _referenced_paths(table.current_snapshot(), table.io)
    except Exception:
        logger.warning("commit outcome unknown; keeping %d written file(s)", len(files))
        return
    for f in files:
        if f.file_path not in live:
            try:
                table.io.delete(f.file_path)
            except Exception:
                logger.warning("cannot delete uncommitted file %s", f.file_path, exc_info=True)


def _referenced_paths(snapshot: Snapshot | None, io: FileIO) -> set[str]:
    """Every data and delete file path ``snapshot`` references."""
    if snapshot is None:
        return set()
    return {
        entry.data_file.file_path
        for manifest in snapshot.manifests(io)
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=True)
    }


# --- committing ------------------------------------------------------------------------------


def _commit(
    table: Table,
    files: Sequence[DataFile],
    snapshot_properties: Mapping[str, str] | None,
    *,
    referenced: set[str] | None = None,
) -> int:
    """Commit data and delete files as one snapshot (one transaction, one producer).

    On a conflict pyiceberg retries by re-running the producer, which rewrites the manifests
    against the refreshed table and takes the next sequence number there."""
    with transaction(table) as tx:
        producer = _RowDelta(
            operation=Operation.APPEND,  # replaced by _RowDelta._manifests
            transaction=tx,
            io=table.io,
            snapshot_properties=dict(snapshot_properties or {}),
        )
        producer.referenced_data_files = referenced or set()
        for f in files:
            producer.append_data_file(f)
        producer.commit()
    logger.info(
        "committed snapshot %d to %s: %s",
        producer.snapshot_id,
        table.name(),
        ", ".join(f"{f.content.name.lower()}={f.record_count}" for f in files),
    )
    return producer.snapshot_id


class _DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest of delete files: ``content`` 1 in the manifest list and ``"deletes"`` in the
    Avro metadata. Readers apply delete files only from such manifests."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _RowDelta(_FastAppendFiles):
    """A fast append whose delete files go into a delete manifest (Java's ``RowDelta``).

    Its operation is named as Java names it: append (data only), delete (deletes only) or
    overwrite (both). As in Java's RowDelta without extra validations, concurrent appends do not
    conflict (an equality delete committed after them deletes their matching keys too: last
    writer wins); position deletes re-check on retry that their data files are still live."""

    referenced_data_files: set[str]

    def _manifests(self) -> list[ManifestFile]:
        self._operation = self._row_delta_operation()
        data = [f for f in self._added_data_files if f.content == DataFileContent.DATA]
        deletes = [f for f in self._added_data_files if f.content != DataFileContent.DATA]
        spec = self._transaction.table_metadata.spec()
        written = []
        if data:
            written.append(self._write(self.new_manifest_writer(spec), data))
        if deletes:
            writer = _DeleteManifestWriter(
                spec,
                self.schema(),
                self.new_manifest_output(),
                self._snapshot_id,
                self._compression,
            )
            written.append(self._write(writer, deletes))
        return self._process_manifests(written + self._existing_manifests())

    def _row_delta_operation(self) -> Operation:
        is_data = {f.content == DataFileContent.DATA for f in self._added_data_files}
        if is_data == {True}:
            return Operation.APPEND
        return Operation.DELETE if is_data == {False} else Operation.OVERWRITE

    def _write(self, writer: ManifestWriter, files: Iterable[DataFile]) -> ManifestFile:
        """Add ``files`` with unassigned sequence numbers: the manifest list assigns this
        snapshot's, so data and delete files share one sequence number."""
        with writer:
            for f in files:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self._snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=f,
                    )
                )
        return writer.to_manifest_file()

    def _validate_concurrency(self) -> None:
        if not self.referenced_data_files:
            return
        table = self._transaction._table
        gone = self.referenced_data_files - _data_file_paths(
            table.metadata.current_snapshot(), table.io
        )
        if gone:
            raise ValidationException(
                f"position deletes reference data files removed concurrently: {sorted(gone)}"
            )
