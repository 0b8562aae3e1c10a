"""Input checks shared by the catalog's operations (no database access)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from flight_gateway.protocol.errors import InvalidArgument

_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_][A-Za-z0-9_\-]*)*$")
_SOURCE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
MAX_TTL_S = 86400.0


def check_table_name(name: object) -> str:
    if not isinstance(name, str) or len(name) > 512 or not _TABLE_NAME.fullmatch(name):
        raise InvalidArgument(
            f"invalid table name {name!r}: use letters, digits, '_' or '-', optionally "
            "namespaced with '.' (e.g. 'ns.logs')"
        )
    return name


def check_source_name(name: str) -> str:
    if not isinstance(name, str) or len(name) > 512 or not _SOURCE_NAME.fullmatch(name):
        raise InvalidArgument(f"invalid source name {name!r}")
    return name


def to_json(value: Any, what: str) -> str:
    """``value`` as JSON text; the check that it can be stored at all."""
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"{what} is not JSON-serialisable: {e}") from e


def check_json(value: Any, what: str) -> None:
    to_json(value, what)


def as_list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise InvalidArgument(f"{what} must be a list")
    return list(value)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_ttl(ttl_s: object) -> float:
    if not is_number(ttl_s) or not 0 < ttl_s <= MAX_TTL_S:  # type: ignore[operator]
        raise InvalidArgument(f"ttl_s must be in (0, {MAX_TTL_S:g}], got {ttl_s!r}")
    return float(ttl_s)  # type: ignore[arg-type]


def check_positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**63 - 1:
        raise InvalidArgument(f"{what} must be a positive integer below 2**63, got {value!r}")
    return value


def new_id(result: Any) -> int:
    """The primary key of the row an INSERT just made."""
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])
