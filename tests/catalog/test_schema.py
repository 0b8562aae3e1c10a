"""Schema evolution rules and Arrow type strings (no database)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flight_gateway.catalog.schema import evolve, new_schema
from flight_gateway.protocol.arrow_types import canonical, is_safe_widening, parse_type
from flight_gateway.protocol.errors import InvalidArgument


@pytest.mark.parametrize(
    "t",
    [
        pa.int64(),
        pa.timestamp("us", tz="UTC"),
        pa.timestamp("ns"),
        pa.decimal128(10, 2),
        pa.list_(pa.int64()),
        pa.struct([("a", pa.int32()), ("b", pa.list_(pa.string()))]),
        pa.map_(pa.string(), pa.float64()),
        pa.date32(),
        pa.float32(),
        pa.bool_(),
        pa.binary(4),
        pa.large_string(),
        pa.time64("us"),
        pa.decimal256(50, 3),
    ],
)
def test_type_strings_round_trip(t: pa.DataType) -> None:
    assert parse_type(str(t)) == t


def test_aliases_and_errors() -> None:
    assert canonical("float32") == "float" and canonical("boolean") == "bool"
    with pytest.raises(InvalidArgument, match="unknown Arrow type"):
        parse_type("varchar(10)")


@pytest.mark.parametrize(
    ("old", "new", "ok"),
    [
        ("int32", "int64", True),
        ("int64", "int32", False),
        ("float", "double", True),
        ("double", "float", False),
        ("decimal128(10, 2)", "decimal128(12, 2)", True),
        ("decimal128(10, 2)", "decimal128(12, 3)", False),
        ("decimal128(10, 2)", "decimal128(8, 2)", False),
        ("string", "int64", False),
        ("int64", "int64", False),
    ],
)
def test_widening_rules(old: str, new: str, ok: bool) -> None:
    assert is_safe_widening(old, new) is ok


def test_evolve_by_field_id_and_validation() -> None:
    s = new_schema([{"name": "a", "type": "int32"}, {"name": "b", "type": "string"}])
    s1 = evolve(s, [{"op": "rename_column", "field_id": 2, "new_name": "c"}])
    assert s1.schema_id == 1 and [(f.id, f.name) for f in s1.fields] == [(1, "a"), (2, "c")]
    with pytest.raises(InvalidArgument, match="already exists"):
        evolve(s, [{"op": "rename_column", "name": "a", "new_name": "b"}])
    with pytest.raises(InvalidArgument, match="already exists"):
        evolve(s, [{"op": "add_column", "name": "a", "type": "int64"}])
    with pytest.raises(InvalidArgument, match="must be nullable"):
        evolve(s, [{"op": "add_column", "name": "z", "type": "int64", "nullable": False}])
    with pytest.raises(InvalidArgument, match="does not exist"):
        evolve(s, [{"op": "drop_column", "name": "zz"}])
    with pytest.raises(InvalidArgument, match="unknown schema change op"):
        evolve(s, [{"op": "truncate"}])
    # Ids are never reused, even for the highest id dropped before.
    s2 = evolve(s, [{"op": "drop_column", "name": "b"}])
    s3 = evolve(s2, [{"op": "add_column", "name": "b", "type": "string"}], last_field_id=2)
    assert s3.field("b").id == 3
