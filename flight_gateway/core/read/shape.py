"""What a read produces: the projection, the parsed filter, and the columns sources must give."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from flight_gateway.catalog import TableSnapshot
from flight_gateway.catalog.schema import Schema
from flight_gateway.protocol import ReadRequest
from flight_gateway.protocol.arrow_types import parse_type
from flight_gateway.protocol.errors import InvalidArgument
from planners.kind import ColumnSpec
from planners.predicates import Expr, can_match, columns, parse_filter


def arrow_schema(schema: Schema, names: Sequence[str] | None = None) -> pa.Schema:
    """The Arrow schema of ``names`` (all columns when None); every field nullable (a source may
    lack a column, and Spark requires nullable fields)."""
    fields = schema.fields if names is None else [schema.field(n) for n in names]
    return pa.schema([pa.field(f.name, parse_type(f.type), nullable=True) for f in fields])


def column_specs(snap: TableSnapshot, names: Sequence[str]) -> tuple[ColumnSpec, ...]:
    fields = (snap.schema.field(n) for n in names)
    return tuple(ColumnSpec(f.id, f.name, f.type, f.aliases) for f in fields)


@dataclass(frozen=True)
class ReadShape:
    projection: list[str]
    predicate: Expr | None
    #: Columns to read from sources: the projection plus the filter's columns.
    specs: tuple[ColumnSpec, ...]


def resolve(snap: TableSnapshot, cols: Sequence[str] | None, flt: str | None) -> ReadShape:
    names = snap.schema.names
    projection = list(cols) if cols is not None else names
    unknown = [c for c in projection if c not in names]
    if unknown:
        raise InvalidArgument(
            f"unknown column(s) {unknown} in table {snap.table!r} (columns: {names})"
        )
    predicate = parse_filter(flt, arrow_schema(snap.schema))
    needed = projection + sorted(columns(predicate) - set(projection)) if predicate else projection
    return ReadShape(projection, predicate, column_specs(snap, needed))


def candidate_sources(snap: TableSnapshot, req: ReadRequest, predicate: Expr | None) -> set[str]:
    """Sources the read must open: those selected (``sources``) whose partition values can
    match the filter. Naming an unknown source is NOT_FOUND."""
    for name in req.sources or ():
        snap.source(name)
    full = arrow_schema(snap.schema)
    return {
        s.name
        for s in snap.sources
        if (req.sources is None or s.name in req.sources)
        and can_match(predicate, s.partition, full)
    }
