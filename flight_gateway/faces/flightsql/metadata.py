"""Flight SQL metadata results (schemas as the Flight SQL specification fixes them).

Harness tables appear as catalog ``harness``, schema ``main``, type ``TABLE``; a caller sees
only the tables it may read.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from flight_gateway.faces.flightsql.query import CATALOG, SCHEMA
from flight_gateway.protocol.errors import InvalidArgument

CATALOGS = pa.schema([pa.field("catalog_name", pa.utf8(), False)])
DB_SCHEMAS = pa.schema(
    [pa.field("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8(), False)]
)
TABLES = pa.schema(
    [
        pa.field("catalog_name", pa.utf8()),
        pa.field("db_schema_name", pa.utf8()),
        pa.field("table_name", pa.utf8(), False),
        pa.field("table_type", pa.utf8(), False),
    ]
)
TABLES_WITH_SCHEMA = TABLES.append(pa.field("table_schema", pa.binary(), False))
TABLE_TYPES = pa.schema([pa.field("table_type", pa.utf8(), False)])
PRIMARY_KEYS = pa.schema(
    [
        pa.field("catalog_name", pa.utf8()),
        pa.field("db_schema_name", pa.utf8()),
        pa.field("table_name", pa.utf8(), False),
        pa.field("column_name", pa.utf8(), False),
        pa.field("key_sequence", pa.int32(), False),
        pa.field("key_name", pa.utf8()),
    ]
)
# The spec declares the union's children non-nullable; pyarrow builds dense unions with nullable
# children and cannot cast between the two, and clients read either.
_VALUE = pa.dense_union(
    [
        pa.field("string_value", pa.utf8()),
        pa.field("bool_value", pa.bool_()),
        pa.field("bigint_value", pa.int64()),
        pa.field("int32_bitmask", pa.int32()),
        pa.field("string_list", pa.list_(pa.utf8())),
        pa.field("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.int32()))),
    ]
)
SQL_INFO = pa.schema([pa.field("info_name", pa.uint32(), False), pa.field("value", _VALUE, False)])


#: Longer filter patterns are refused (matching costs name length x pattern length).
MAX_PATTERN = 1024


def sql_like(pattern: str | None, value: str) -> bool:
    """SQL LIKE as Flight SQL filter patterns use it (``%`` and ``_``); no pattern matches all.

    Without backtracking (a regex of many ``.*`` took seconds for a dozen ``%``): the pattern
    is cut at each ``%``; the first piece must match at the start, the last at the end, and
    each piece between at its leftmost place after the one before (leftmost is never worse).
    """
    if not pattern:
        return True
    if len(pattern) > MAX_PATTERN:
        raise InvalidArgument(f"a filter pattern may have at most {MAX_PATTERN} characters")
    pieces = pattern.split("%")
    if len(pieces) == 1:
        return len(value) == len(pattern) and _at(pattern, value, 0)
    first, *middle, last = pieces
    if len(first) + len(last) > len(value):
        return False
    if not _at(first, value, 0) or not _at(last, value, len(value) - len(last)):
        return False
    pos, end = len(first), len(value) - len(last)
    for piece in middle:
        found = _find(piece, value, pos, end)
        if found < 0:
            return False
        pos = found + len(piece)
    return True


def _at(piece: str, value: str, pos: int) -> bool:
    """``piece`` (``_`` any one character) matches ``value`` at ``pos``."""
    if pos < 0 or pos + len(piece) > len(value):
        return False
    return all(
        p == "_" or p == v for p, v in zip(piece, value[pos : pos + len(piece)], strict=True)
    )


def _find(piece: str, value: str, start: int, end: int) -> int:
    """The leftmost place in ``value[start:end]`` where ``piece`` matches, or -1."""
    if "_" not in piece:
        return value.find(piece, start, end)
    for pos in range(start, end - len(piece) + 1):
        if _at(piece, value, pos):
            return pos
    return -1


def catalogs() -> pa.Table:
    return pa.table([pa.array([CATALOG])], schema=CATALOGS)


def db_schemas(catalog: str | None, pattern: str | None) -> pa.Table:
    rows = [SCHEMA] if catalog in (None, "", CATALOG) and sql_like(pattern, SCHEMA) else []
    return pa.table([pa.array([CATALOG] * len(rows)), pa.array(rows)], schema=DB_SCHEMAS)


def in_scope(catalog: str | None, schema_pattern: str | None) -> bool:
    return catalog in (None, "", CATALOG) and sql_like(schema_pattern, SCHEMA)


def tables(names: Sequence[str], schemas: Sequence[pa.Schema] | None) -> pa.Table:
    cols = [
        pa.array([CATALOG] * len(names)),
        pa.array([SCHEMA] * len(names)),
        pa.array(list(names), pa.utf8()),
        pa.array(["TABLE"] * len(names)),
    ]
    if schemas is None:
        return pa.table(cols, schema=TABLES)
    cols.append(pa.array([s.serialize().to_pybytes() for s in schemas], pa.binary()))
    return pa.table(cols, schema=TABLES_WITH_SCHEMA)


def table_types() -> pa.Table:
    return pa.table([pa.array(["TABLE"])], schema=TABLE_TYPES)


def primary_keys(table: str, keys: Sequence[str]) -> pa.Table:
    n = len(keys)
    return pa.table(
        [
            pa.array([CATALOG] * n),
            pa.array([SCHEMA] * n),
            pa.array([table] * n),
            pa.array(list(keys), pa.utf8()),
            pa.array(list(range(1, n + 1)), pa.int32()),
            pa.array([None] * n, pa.utf8()),
        ],
        schema=PRIMARY_KEYS,
    )


def sql_info(values: dict[int, str | bool | int], wanted: Sequence[int]) -> pa.Table:
    """Rows of ``SqlInfo`` ids (all known ones when ``wanted`` is empty)."""
    ids = [i for i in (wanted or sorted(values)) if i in values]
    type_ids, offsets = [], []
    strings: list[str] = []
    bools: list[bool] = []
    ints: list[int] = []
    for i in ids:
        v = values[i]
        if isinstance(v, bool):
            type_ids.append(1)
            offsets.append(len(bools))
            bools.append(v)
        elif isinstance(v, int):
            type_ids.append(2)
            offsets.append(len(ints))
            ints.append(v)
        else:
            type_ids.append(0)
            offsets.append(len(strings))
            strings.append(str(v))
    children = [
        pa.array(strings, pa.utf8()),
        pa.array(bools, pa.bool_()),
        pa.array(ints, pa.int64()),
        pa.array([], pa.int32()),
        pa.array([], pa.list_(pa.utf8())),
        pa.array([], pa.map_(pa.int32(), pa.list_(pa.int32()))),
    ]
    value = pa.UnionArray.from_dense(
        pa.array(type_ids, pa.int8()),
        pa.array(offsets, pa.int32()),
        children,
        [f.name for f in _VALUE],
    )
    return pa.table([pa.array(ids, pa.uint32()), value], schema=SQL_INFO)
