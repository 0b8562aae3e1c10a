"""Read descriptors and action bodies (JSON, UTF-8); the actions themselves are ``actions``."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flight_gateway.protocol.errors import InvalidArgument

PROTOCOL_VERSION = 1

#: Flight actions of the harness, name -> one-line description (ListActions).


def decode_json(body: bytes | str, what: str) -> dict[str, Any]:
    """Parse a JSON object; anything else is InvalidArgument naming ``what``."""
    try:
        text = body.decode("utf-8") if isinstance(body, (bytes, bytearray, memoryview)) else body
        value = json.loads(text) if text else {}
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidArgument(f"{what} is not valid UTF-8 JSON: {e}") from e
    if "\\u" in text:  # an escaped lone surrogate decodes to a str no UTF-8 can hold
        _encodable(value, what)
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _encodable(value: Any, what: str) -> None:
    """InvalidArgument when ``value`` holds a lone UTF-16 surrogate (JSON ``"\\ud800"``): a
    table, column or owner so named could never be written to the catalog, a log, a
    Flight message or PostgreSQL."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(
            f"{what} holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is no character"
        ) from None


#: The largest integer a version, a limit or an offset may be (a signed 64-bit column).
MAX_INT64 = 2**63 - 1


def _opt_int(d: Mapping[str, Any], key: str, minimum: int = 0) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= MAX_INT64:
        raise InvalidArgument(f"{key!r} must be an integer >= {minimum} and < 2**63, got {v!r}")
    return v


def parse_timestamp(value: Any, key: str) -> float | None:
    """Epoch seconds from a number or an RFC 3339 string."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int past float's range
            seconds = math.inf
        if math.isfinite(seconds):
            return seconds
    if isinstance(value, str):
        import datetime as dt

        try:
            t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as e:
            raise InvalidArgument(f"{key!r} is not an RFC 3339 timestamp: {value!r}") from e
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.UTC)
        return t.timestamp()
    raise InvalidArgument(f"{key!r} must be epoch seconds or an RFC 3339 string, got {value!r}")


@dataclass(frozen=True)
class ReadRequest:
    """The JSON command of a read descriptor (DESIGN.md §5)."""

    table: str
    columns: tuple[str, ...] | None = None
    filter: str | None = None
    version: int | None = None
    as_of: float | None = None
    limit: int | None = None
    dedupe: bool = False
    #: Read only these sources (extension: pipelines read one source at a pinned version).
    sources: tuple[str, ...] | None = None
    #: Only rows added after this version (extension: streaming micro-batches).
    since: int | None = None
    #: Ask for direct tasks where sources allow them (extension: the data plane).
    direct: bool = False

    _KEYS = frozenset(
        {
            "table",
            "columns",
            "filter",
            "version",
            "as_of",
            "limit",
            "dedupe",
            "sources",
            "since",
            "direct",
        }
    )

    @classmethod
    def from_json(cls, body: bytes | str) -> ReadRequest:
        d = decode_json(body, "read descriptor")
        unknown = set(d) - cls._KEYS
        if unknown:
            raise InvalidArgument(f"unknown read descriptor field(s) {sorted(unknown)}")
        table = d.get("table")
        if not isinstance(table, str) or not table:
            raise InvalidArgument("read descriptor needs 'table' (a non-empty string)")
        cols = d.get("columns")
        if cols is not None and (
            not isinstance(cols, list) or not all(isinstance(c, str) and c for c in cols)
        ):
            raise InvalidArgument("'columns' must be a list of column names")
        if cols is not None and len(set(cols)) != len(cols):
            raise InvalidArgument(f"'columns' names a column twice: {cols}")
        flt = d.get("filter")
        if flt is not None and not isinstance(flt, str):
            raise InvalidArgument("'filter' must be a SQL boolean expression string")
        dedupe, direct = d.get("dedupe", False), d.get("direct", False)
        if not isinstance(dedupe, bool) or not isinstance(direct, bool):
            raise InvalidArgument("'dedupe' and 'direct' must be true or false")
        srcs = d.get("sources")
        if srcs is not None and (
            not isinstance(srcs, list) or not all(isinstance(x, str) and x for x in srcs)
        ):
            raise InvalidArgument("'sources' must be a list of source names")
        version, as_of = _opt_int(d, "version"), parse_timestamp(d.get("as_of"), "as_of")
        if version is not None and as_of is not None:
            raise InvalidArgument("give 'version' or 'as_of', not both")
        return cls(
            table=table,
            columns=tuple(cols) if cols is not None else None,
            filter=flt,
            version=version,
            as_of=as_of,
            limit=_opt_int(d, "limit"),
            dedupe=dedupe,
            sources=tuple(srcs) if srcs is not None else None,
            since=_opt_int(d, "since"),
            direct=direct,
        )

    @classmethod
    def for_path(cls, path: list[bytes | str]) -> ReadRequest:
        parts = [p.decode() if isinstance(p, bytes) else p for p in path]
        if len(parts) != 1 or not parts[0]:
            raise InvalidArgument(f"a path descriptor is one table name, got {parts!r}")
        return cls(table=parts[0])

    def to_json(self) -> str:
        d: dict[str, Any] = {"table": self.table}
        for key in ("filter", "version", "as_of", "limit"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.columns is not None:
            d["columns"] = list(self.columns)
        if self.dedupe:
            d["dedupe"] = True
        if self.sources is not None:
            d["sources"] = list(self.sources)
        if self.since is not None:
            d["since"] = self.since
        if self.direct:
            d["direct"] = True
        return json.dumps(d)
