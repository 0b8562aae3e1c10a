"""pyiceberg transactions that build their table metadata once per staged state.

pyiceberg 0.12's ``Transaction.table_metadata`` replays the staged updates and deep-copies the
whole table metadata (every snapshot, the snapshot and metadata logs) on each read, and an
append reads it about 19 times. Measured on a table of 150 snapshots: 85 % of an append's time
(about 100 ms idle, seconds in a loaded gateway, where it is Python competing for the GIL), all
of it under the source's write lease, so every other writer of the source waited for it. Here
the metadata is built once per (table metadata, staged updates) pair: both are replaced, never
changed in place, when a transaction stages an update or its table is refreshed, so an identity
check keeps the answer current, and with nothing staged the answer is the table's metadata
itself. The same change was proposed upstream
(apache/iceberg-python#3302, approved, closed as stale; #3784).

The catalogs the gateway opens (``share_metadata``) also stage a commit's metadata without
pyiceberg's final deep copy of it (``updated_metadata``), and every metadata file is parsed
once (``keep_metadata_parsed``): at 600 snapshots an idle append went from 134 to 52 ms.
"""

from __future__ import annotations

import logging
import threading
import types
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import StagedTable, Table
from pyiceberg.table import Transaction as _Transaction
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
    update_table_metadata,
)
from pyiceberg.utils.datetime import datetime_to_millis

log = logging.getLogger(__name__)


class Transaction(_Transaction):
    _built: tuple[TableMetadata, Any, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        if not updates:  # nothing staged: the table's own (pyiceberg never changes it in place)
            return base
        built = self._built
        if built is None or built[0] is not base or built[1] is not updates:
            built = (base, updates, updated_metadata(base, updates))
            self._built = built
        return built[2]


def transaction(table: Table) -> Transaction:
    """``table.transaction()``, with its metadata built once per staged state."""
    return Transaction(table)


def append(table: Table, data: pa.Table, snapshot_properties: Mapping[str, str]) -> None:
    """``table.append``, with its metadata built once per staged state."""
    with transaction(table) as tx:
        tx.append(data, snapshot_properties=dict(snapshot_properties))


@dataclass
class PreparedFiles:
    """Data files an append wrote before its lease (``write_data_files``), for the schema and
    partition spec they were written with."""

    table_uuid: Any
    schema_id: int
    spec_id: int
    files: list[Any]
    #: Set before the commit that names them is tried: from then on they may be referenced
    #: (a commit that failed may still have landed) and are never deleted.
    used: bool = False


def write_data_files(table: Table, data: pa.Table) -> PreparedFiles:
    """Write ``data`` (already fitted to the table's schema) as the table's data files, as
    ``Transaction.append`` would, without committing them."""
    from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible, _dataframe_to_data_files
    from pyiceberg.table import DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE
    from pyiceberg.utils.config import Config

    meta = table.metadata
    _check_pyarrow_schema_compatible(
        meta.schema(),
        provided_schema=data.schema,
        downcast_ns_timestamp_to_us=Config().get_bool(DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE)
        or False,
        format_version=meta.format_version,
    )
    files = list(_dataframe_to_data_files(table_metadata=meta, df=data, io=table.io))
    return PreparedFiles(meta.table_uuid, meta.current_schema_id, meta.default_spec_id, files)


def fits(table: Table, prepared: PreparedFiles) -> bool:
    """Whether files written for ``prepared``'s table, schema and spec may be committed to
    ``table`` as it is now (not when the source now names another table, or its table was
    dropped and created again: the files live under the old one's location)."""
    meta = table.metadata
    now = (meta.table_uuid, meta.current_schema_id, meta.default_spec_id)
    return now == (prepared.table_uuid, prepared.schema_id, prepared.spec_id)


def append_files(
    table: Table, prepared: PreparedFiles, snapshot_properties: Mapping[str, str]
) -> None:
    """Commit ``prepared``'s files as one append snapshot (fast or merging, as the table's
    properties choose, like ``Transaction.append``)."""
    from pyiceberg.table.refs import MAIN_BRANCH

    with transaction(table) as tx:
        producer = tx._append_snapshot_producer(dict(snapshot_properties), branch=MAIN_BRANCH)
        with producer as files:
            for data_file in prepared.files:
                files.append_data_file(data_file)
        prepared.used = True


def append_many(
    table: Table, batches: Sequence[tuple[PreparedFiles, Mapping[str, str]]]
) -> list[int]:
    """Commit each ``(files, snapshot properties)`` as its own append snapshot, in order, each
    the parent of the next, in one transaction: one metadata file and one catalog commit for
    all of them. The snapshots' ids, in order."""
    from pyiceberg.table.refs import MAIN_BRANCH

    ids = []
    with transaction(table) as tx:
        for prepared, props in batches:
            producer = tx._append_snapshot_producer(dict(props), branch=MAIN_BRANCH)
            with producer as files:
                for data_file in prepared.files:
                    files.append_data_file(data_file)
            ids.append(producer._snapshot_id)
        for prepared, _ in batches:
            prepared.used = True
    return ids


def delete_files(table: Table, prepared: PreparedFiles) -> None:
    """Remove prepared files no commit used (best effort: an orphan is only space)."""
    if prepared.used:
        return
    for data_file in prepared.files:
        try:
            table.io.delete(data_file.file_path)
        except Exception:  # already gone, or the store refuses: left for orphan cleanup
            log.info("could not remove unused data file %s", data_file.file_path, exc_info=True)


def updated_metadata(
    base: TableMetadata,
    updates: tuple[Any, ...],
    enforce_validation: bool = False,
    metadata_location: str | None = None,
) -> TableMetadata:
    """``pyiceberg.table.update.update_table_metadata`` without its last step, a deep copy of
    the whole new metadata (every snapshot, both logs). Each update makes a new metadata that
    shares what it does not change with the one before, and pyiceberg's models are frozen and
    never changed in place, so the copy protects nothing. At 600 snapshots it was 60 % of an
    append (two copies of ~60 ms each, idle), all of it under the source's write lease."""
    if enforce_validation:  # a new table: parsed again from scratch, as pyiceberg does
        return update_table_metadata(base, updates, enforce_validation, metadata_location)
    context = _TableMetadataUpdateContext()
    new = base
    for update in updates:
        new = _apply_table_update(update, new, context)
    if context.has_changes():
        if metadata_location:
            new = _update_table_metadata_log(new, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == new.last_updated_ms:
            now = datetime_to_millis(datetime.now().astimezone())
            new = new.model_copy(update={"last_updated_ms": now})
    new.spec().check_compatible(new.schema())
    new.sort_order().check_compatible(new.schema())
    return new


def share_metadata(catalog: Any) -> None:
    """Make ``catalog`` stage its commits with ``updated_metadata``: a metastore catalog (SQL,
    Glue, Hive, ...) builds the committed metadata itself, a REST catalog's server does."""
    from pyiceberg.catalog import MetastoreCatalog

    from planners.iceberg_manifests import cache_pyiceberg_reads

    keep_metadata_parsed()
    cache_pyiceberg_reads()
    if isinstance(catalog, MetastoreCatalog):
        catalog._update_and_stage_table = types.MethodType(_update_and_stage_table, catalog)  # type: ignore[method-assign]


def _update_and_stage_table(
    self: Any,
    current_table: Table | None,
    table_identifier: Any,
    requirements: tuple[Any, ...],
    updates: tuple[Any, ...],
) -> StagedTable:
    """``MetastoreCatalog._update_and_stage_table`` of pyiceberg 0.12, staging the metadata
    with ``updated_metadata``."""
    for requirement in requirements:
        requirement.validate(current_table.metadata if current_table else None)
    updated = updated_metadata(
        current_table.metadata if current_table else self._empty_table_metadata(),
        updates,
        enforce_validation=current_table is None,
        metadata_location=current_table.metadata_location if current_table else None,
    )
    version = (
        self._parse_metadata_version(current_table.metadata_location) + 1 if current_table else 0
    )
    provider = load_location_provider(updated.location, updated.properties)
    location = provider.new_table_metadata_file_location(version)
    # The commit writes exactly this metadata there (or fails, and nothing ever names the
    # file): the next load of the table, this writer's next append or a read's plan, finds it
    # parsed. Under a write load each commit's file was parsed again by the next load (30 % of
    # an Iceberg DoPut's samples, 16 writers and 64 readers on 2 cores).
    _keep(location, updated)
    return StagedTable(
        identifier=table_identifier,
        metadata=updated,
        metadata_location=location,
        io=self._load_file_io(properties=updated.properties, location=location),
        catalog=self,
    )


#: Parsed metadata files by location (with their weight), the latest used last.
_PARSED: OrderedDict[str, tuple[TableMetadata, int]] = OrderedDict()
_PARSED_LOCK = threading.Lock()
#: Metadata files kept parsed, at most this many, and at most this many snapshot and log
#: entries in all (each a few KB parsed: a table's whole history is in each of its files).
PARSED_KEPT = 16
PARSED_ENTRIES = 20_000
_parse = FromInputFile.table_metadata


def _weight(metadata: TableMetadata) -> int:
    return 1 + len(metadata.snapshots) + len(metadata.snapshot_log) + len(metadata.metadata_log)


def _table_metadata(input_file: Any, encoding: str = "utf-8") -> TableMetadata:
    location = str(input_file.location)
    with _PARSED_LOCK:
        hit = _PARSED.get(location)
        if hit is not None:
            _PARSED.move_to_end(location)
            return hit[0]
    metadata = _parse(input_file, encoding)
    _keep(location, metadata)
    return metadata


def _keep(location: str, metadata: TableMetadata) -> None:
    with _PARSED_LOCK:
        _PARSED[location] = (metadata, _weight(metadata))
        total = sum(w for _, w in _PARSED.values())
        while len(_PARSED) > 1 and (len(_PARSED) > PARSED_KEPT or total > PARSED_ENTRIES):
            total -= _PARSED.popitem(last=False)[1][1]


def keep_metadata_parsed() -> None:
    """Parse each metadata file once: a table's metadata file is never rewritten (a commit
    writes a new one, named with a UUID), and parsing one of 600 snapshots took 22 ms, twice
    per append (the appender's load and the catalog's check at commit) and once per read
    that loads the table. The catalog's FileIO still makes the input file first (the
    gateway's guarded one checks its location there); a file parsed before is not opened."""
    FromInputFile.table_metadata = staticmethod(_table_metadata)  # type: ignore[method-assign]
