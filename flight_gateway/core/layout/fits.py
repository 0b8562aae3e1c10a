"""Whether a source's files, read where they are by an Iceberg reader (columns by field id, or
by name through the table's name mapping), give exactly the rows the kind's own read gives;
when they do not, the source is made a slice of instead (DESIGN §16)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from planners.kind import ColumnSpec
from planners.layout import FileLayout, name_mapping, widens


def misfit(layout: FileLayout, columns: Sequence[ColumnSpec]) -> str | None:
    """Why ``layout`` cannot be served in place for ``columns``, or None when it can."""
    by_id = {c.field_id: c for c in columns}
    for c in columns:
        if c.name in layout.field_ids and layout.field_ids[c.name] != c.field_id:
            return f"column {c.name!r} has field id {layout.field_ids[c.name]} in the files"
        if c.field_id in layout.file_ids and c.name not in layout.field_ids:
            return f"field id {c.field_id} of column {c.name!r} is another column in the files"
        found = layout.physical.get(c.name)
        if found is None:
            continue
        _, have = found
        if not widens(have, c.arrow_type):
            return f"column {c.name!r} is {have} in the files, not {c.arrow_type}"
    if not layout.field_ids:
        names = name_mapping(columns)
        for c in columns:
            found = layout.physical.get(c.name)
            if found is not None and by_id.get(names.get(found[0], -1)) is not c:
                return f"column {c.name!r} is {found[0]!r} in the files, another column's name"
    return None


def positions_schema() -> pa.Schema:
    """An Iceberg position delete file's columns (their reserved field ids)."""
    return pa.schema([
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": b"2147483546"}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"2147483545"}),
    ])  # fmt: skip
