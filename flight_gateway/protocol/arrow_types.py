"""Arrow type strings: the spelling used in schemas on the wire and in the catalog.

The canonical spelling of a type is ``str(pa_type)`` (``int64``, ``timestamp[us, tz=UTC]``,
``decimal128(10, 2)``, ``list<item: int64>``). ``parse_type`` accepts that spelling plus the
aliases of ``pyarrow.type_for_alias`` and returns the pyarrow type; ``canonical`` normalises a
spelling so that two spellings of one type compare equal.
"""

from __future__ import annotations

import re

import pyarrow as pa

from flight_gateway.protocol.errors import InvalidArgument

_TS = re.compile(r"^timestamp\[(s|ms|us|ns)(?:,\s*tz=([^\]]+))?\]$")
_DEC = re.compile(r"^decimal(128|256)?\((\d+),\s*(-?\d+)\)$")
_FSB = re.compile(r"^fixed_size_binary\[(\d+)\]$")

_EXTRA_ALIASES = {"boolean": pa.bool_(), "integer": pa.int32(), "long": pa.int64()}


def _split_top(text: str) -> list[str]:
    """Split on commas that are not nested inside <>, () or []."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _parse_field(text: str) -> pa.Field:
    name, sep, type_text = text.partition(":")
    if not sep:
        raise InvalidArgument(f"expected 'name: type' in nested type, got {text!r}")
    nullable = True
    type_text = type_text.strip()
    if type_text.endswith(" not null"):
        nullable = False
        type_text = type_text[: -len(" not null")]
    return pa.field(name.strip(), parse_type(type_text), nullable=nullable)


def parse_type(text: str) -> pa.DataType:
    """Parse an Arrow type string into a pyarrow type, or raise InvalidArgument."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgument(f"type must be a non-empty string, got {text!r}")
    t = text.strip()
    low = t.lower()
    if low in _EXTRA_ALIASES:
        return _EXTRA_ALIASES[low]
    if m := _TS.fullmatch(t):
        return pa.timestamp(m.group(1), tz=m.group(2).strip() if m.group(2) else None)
    if m := _DEC.fullmatch(low):
        precision, scale = int(m.group(2)), int(m.group(3))
        try:
            if m.group(1) == "256" or precision > 38:
                return pa.decimal256(precision, scale)
            return pa.decimal128(precision, scale)
        except (ValueError, pa.ArrowInvalid) as e:
            raise InvalidArgument(f"invalid decimal type {text!r}: {e}") from e
    if m := _FSB.fullmatch(low):
        return pa.binary(int(m.group(1)))
    for prefix, ctor in (("list<", pa.list_), ("large_list<", pa.large_list)):
        if low.startswith(prefix) and t.endswith(">"):
            inner = t[len(prefix) : -1].strip()
            if ":" in inner and not inner.startswith(("struct<", "map<", "list<")):
                return ctor(_parse_field(inner))
            return ctor(parse_type(inner))
    if low.startswith("struct<") and t.endswith(">"):
        return pa.struct([_parse_field(p) for p in _split_top(t[len("struct<") : -1])])
    if low.startswith("map<") and t.endswith(">"):
        parts = _split_top(t[len("map<") : -1])
        if len(parts) != 2:
            raise InvalidArgument(f"map type needs key and value types: {text!r}")
        return pa.map_(parse_type(parts[0]), parse_type(parts[1]))
    try:
        return pa.type_for_alias(low)
    except (ValueError, KeyError) as e:
        raise InvalidArgument(f"unknown Arrow type {text!r}") from e


def canonical(text: str) -> str:
    """The canonical spelling of a type string (``str`` of the parsed pyarrow type), for a
    new column: its time zones must be ones Arrow knows (a filter on a timestamp of an unknown
    zone fails every read)."""
    t = parse_type(text)
    _check_zones(t, text)
    return str(t)


def _check_zones(t: pa.DataType, text: str) -> None:
    if pa.types.is_timestamp(t) and t.tz is not None:
        import pyarrow.compute as pc

        try:
            pc.hour(pa.array([0], t))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidArgument(f"type {text!r}: unknown time zone {t.tz!r}") from e
    for i in range(t.num_fields):
        _check_zones(t.field(i).type, text)


# Safe widenings (no value can be lost). Decimal widening is handled separately.
_WIDEN: dict[str, set[str]] = {
    "int8": {"int16", "int32", "int64"},
    "int16": {"int32", "int64"},
    "int32": {"int64"},
    "uint8": {"uint16", "uint32", "uint64", "int16", "int32", "int64"},
    "uint16": {"uint32", "uint64", "int32", "int64"},
    "uint32": {"uint64", "int64"},
    "float": {"double"},
    "halffloat": {"float", "double"},
    "date32[day]": {"date64[ms]"},
    "string": {"large_string"},
    "binary": {"large_binary"},
}


def is_safe_widening(old: str, new: str) -> bool:
    """True when every value of type ``old`` is representable unchanged in type ``new``."""
    old_t, new_t = parse_type(old), parse_type(new)
    if old_t == new_t:
        return False
    if pa.types.is_decimal(old_t) and pa.types.is_decimal(new_t):
        # Same scale, more integer digits: every old value fits.
        return bool(new_t.scale == old_t.scale and new_t.precision > old_t.precision)
    return str(new_t) in _WIDEN.get(str(old_t), set())
