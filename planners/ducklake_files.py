"""A pinned DuckLake snapshot as its data files in place (DESIGN §16), read from the lake's
metadata tables.

What a layout needs (the table at the snapshot, whether its files are exactly its rows, the
files, their row counts, the columns and their types) is all in DuckLake's own tables, which
DuckDB reads through the metadata database's scanner in a few ms each. The lake's catalog is
not loaded: on a freshly attached lake (``ducklake_pool`` attaches afresh for every use) the
first statement that touches it (``ducklake_list_files``, ``SELECT ... LIMIT 0``) loads the
catalog of the snapshot, ~25 ms of a layout's ~50. A column type outside ``_ARROW`` (nested,
zoned, ``uuid``, ...) is left to that statement, which types it as DuckDB reads it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from planners.common import physical_names
from planners.kind import ScanRequest
from planners.layout import FileLayout, LaidFile, as_uri

META = "__ducklake_metadata_lake"  # DuckLake's own tables, for the lake attached as ``lake``
LIVE = "begin_snapshot <= $snap AND (end_snapshot IS NULL OR end_snapshot > $snap)"

#: DuckLake's column types as DuckDB gives them to Arrow (checked against DuckDB's own
#: typing by tests/planners/test_ducklake_layout.py).
_ARROW: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "date": pa.date32(),
    "time": pa.time64("us"),
    "timestamp": pa.timestamp("us"),
    "timestamp_s": pa.timestamp("s"),
    "timestamp_ms": pa.timestamp("ms"),
    "timestamp_ns": pa.timestamp("ns"),
    "varchar": pa.string(),
    "blob": pa.binary(),
}
_DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")


def _live(alias: str) -> str:
    """``LIVE`` for the rows of ``alias``."""
    return f"{alias}.begin_snapshot <= $snap AND ({alias}.end_snapshot IS NULL OR " \
        f"{alias}.end_snapshot > $snap)"  # fmt: skip


def arrow_type(ducklake_type: str) -> pa.DataType | None:
    """The Arrow type DuckDB reads a DuckLake column type as, or None when not known here."""
    known = _ARROW.get(ducklake_type)
    if known is not None:
        return known
    m = _DECIMAL.fullmatch(ducklake_type)
    if m is not None and 0 < int(m.group(1)) <= 38:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    return None


def table_id(con: Any, config: Mapping[str, Any], snap: int) -> int | None:
    row = con.execute(
        f"SELECT t.table_id FROM {META}.ducklake_table t JOIN {META}.ducklake_schema s "
        f"ON s.schema_id = t.schema_id WHERE s.schema_name = $schema AND t.table_name = $table "
        f"AND {_live('s')} AND {_live('t')}",
        {"snap": snap, "schema": str(config.get("schema", "main")),
         "table": str(config.get("table"))},
    ).fetchone()  # fmt: skip
    return None if row is None else int(row[0])


def why_not_in_place(con: Any, table: int, snap: int) -> str | None:
    """Why the table's data files at ``snap`` are not exactly its rows, or None."""
    # The snapshots' changes as DuckLake records them (``inlined_insert:<table id>`` among
    # comma-separated entries), not ``lake.snapshots()``: that function cost ~20 ms of a
    # layout's ~50. A table name holding such an entry reads as inlined: sliced, still right.
    (inlined,) = con.execute(
        f"SELECT count(*) FROM {META}.ducklake_snapshot_changes WHERE snapshot_id <= $snap "
        "AND list_has_any(string_split(changes_made, ','), "
        "['inlined_insert:' || $t, 'inlined_delete:' || $t])",
        {"t": str(table), "snap": snap},
    ).fetchone()
    if inlined:
        return "rows or deletes were inlined in the metadata"
    partitioned = con.execute(
        f"SELECT count(*) FROM {META}.ducklake_partition_info WHERE table_id = $t AND {LIVE}",
        {"t": table, "snap": snap},
    ).fetchone()[0]
    if partitioned:
        return "partitioned"
    defaults = con.execute(
        f"SELECT count(*) FROM {META}.ducklake_column WHERE table_id = $t AND {LIVE} "
        "AND initial_default IS NOT NULL",
        {"t": table, "snap": snap},
    ).fetchone()[0]
    return "a column has a default older files read as" if defaults else None


def columns(con: Any, table: int, snap: int) -> tuple[list[tuple[str, int, str]], frozenset[int]]:
    """The table's top-level columns at ``snap`` in order: name, DuckLake column id (the
    files' field id) and DuckLake type; and every column id the table ever had."""
    live = con.execute(
        f"SELECT column_name, column_id, column_type FROM {META}.ducklake_column "
        f"WHERE table_id = $t AND parent_column IS NULL AND {LIVE} ORDER BY column_order",
        {"t": table, "snap": snap},
    ).fetchall()
    ever = con.execute(
        f"SELECT DISTINCT column_id FROM {META}.ducklake_column WHERE table_id = ?", [table]
    ).fetchall()
    return [(str(n), int(i), str(t)) for n, i, t in live], frozenset(int(i) for (i,) in ever)


def row_count(con: Any, at: str, table: int, snap: int) -> int:
    """The table's row count at ``snap`` (no inlined rows nor deletes: ``layout``). From
    its data files' counts in the metadata (~2 ms) unless a file holds rows of later
    snapshots too (``partial_max``): then DuckLake counts them (~45 ms, a scan of the
    snapshot)."""
    total, partial = con.execute(
        f"SELECT sum(record_count), count(partial_max) FROM {META}.ducklake_data_file "
        f"WHERE table_id = $t AND {LIVE}",
        {"t": table, "snap": snap},
    ).fetchone()
    if partial:
        (total,) = con.execute(f"SELECT count(*) FROM {at}").fetchone()
    return int(total or 0)


# A relative path is relative to its parent's: a data or delete file's to its table's, a
# table's to its schema's, a schema's to the lake's data path (the one the attached lake
# uses: ``ducklake_settings``), as DuckLake resolves them; a parent's path ends with a
# separator.
_PATH = (
    "CASE WHEN {f}.path_is_relative THEN (CASE WHEN t.path_is_relative THEN (CASE WHEN "
    "s.path_is_relative THEN (SELECT data_path FROM ducklake_settings('lake')) ELSE '' END) "
    "|| s.path ELSE '' END) || t.path || {f}.path ELSE {f}.path END"
)


def listed(con: Any, table: int, snap: int) -> list[tuple[str, int, str | None]]:
    """The table's data files at ``snap`` by path, each with its size and its delete file,
    as ``ducklake_list_files`` lists them (tests compare the two)."""
    rows = con.execute(
        f"SELECT {_PATH.format(f='df')} AS data_file, df.file_size_bytes, "
        f"CASE WHEN del.path IS NULL THEN NULL ELSE {_PATH.format(f='del')} END "
        f"FROM {META}.ducklake_data_file df "
        f"JOIN {META}.ducklake_table t ON t.table_id = df.table_id AND {_live('t')} "
        f"JOIN {META}.ducklake_schema s ON s.schema_id = t.schema_id AND {_live('s')} "
        f"LEFT JOIN {META}.ducklake_delete_file del ON del.data_file_id = df.data_file_id "
        f"AND {_live('del')} WHERE df.table_id = $t AND {_live('df')} ORDER BY data_file",
        {"t": table, "snap": snap},
    ).fetchall()
    return [(str(p), int(size), None if d is None else str(d)) for p, size, d in rows]


def _schema(con: Any, at: str, cols: list[tuple[str, int, str]]) -> pa.Schema:
    """The table's columns as DuckDB reads them: from the metadata's types when each is
    known here, else by DuckDB (which loads the lake's catalog)."""
    types = [arrow_type(t) for _, _, t in cols]
    if all(t is not None for t in types):
        return pa.schema([pa.field(n, t) for (n, _, _), t in zip(cols, types, strict=True)])
    return con.execute(f"SELECT * FROM {at} LIMIT 0").arrow().schema


def layout(con: Any, request: ScanRequest, snap: int, at: str) -> FileLayout | None:
    """The table's data files at ``snap`` (``at``: the table at it, as SQL) with their row
    counts and column mapping, or None when they are not exactly its rows."""
    table = table_id(con, request.source.config, snap)
    if table is None or why_not_in_place(con, table, snap) is not None:
        return None
    files = listed(con, table, snap)
    if any(delete for _, _, delete in files):
        return None  # deletes as delete files: made a slice of instead
    paths = [p for p, _, _ in files]
    request.check_files("data file", paths)
    counts: dict[str, int] = {}
    if paths:
        counts = dict(
            con.execute(
                "SELECT file_name, num_rows FROM parquet_file_metadata(?::VARCHAR[])", [paths]
            ).fetchall()
        )
    if sum(counts.values()) != row_count(con, at, table, snap):
        return None  # rows the files do not hold, or hold and are gone
    cols, ever = columns(con, table, snap)
    schema = _schema(con, at, cols)
    mapping = physical_names(request.columns, schema.names)
    ids = {name: column_id for name, column_id, _ in cols}
    laid = tuple(LaidFile(as_uri(p), int(size), int(counts[p])) for p, size, _ in files)
    return FileLayout(
        laid,
        {c: (p, schema.field(p).type) for c, p in mapping.items()},
        field_ids={c: ids[p] for c, p in mapping.items() if p in ids},
        file_ids=ever,
        other_names=frozenset(set(schema.names) - set(mapping.values())),
    )
