"""``scan_harness``: a lazy Polars frame over a harness table (Polars' IO-plugin API).

Polars hands the plugin the columns, the predicate and the row limit of the query. The columns
go to the gateway as they are, and the limit too when there is no predicate; the predicate's top-level ``AND`` parts that are a
column compared with a literal (``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``) or a null test are
translated to the harness filter, so the gateway prunes sources and pushes them into each
source. Polars still applies the whole predicate to what arrives (Polars requires it, and it
keeps results exact for the parts that were not translated). One version is pinned when the
frame is created, so every collect of the frame reads the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from clients.client import HarnessClient

_OPS = {"Eq": "=", "NotEq": "!=", "Lt": "<", "LtEq": "<=", "Gt": ">", "GtEq": ">="}


def _literal(node: Any) -> str | None:
    if not isinstance(node, dict) or "Literal" not in node:
        return None
    inner = node["Literal"]
    value = next(iter(inner.values())) if isinstance(inner, dict) else None
    if isinstance(value, dict) and len(value) == 1:
        kind, v = next(iter(value.items()))
        if kind in ("Int", "Float", "Int64", "Int32", "Float64"):
            return repr(v)
        if kind == "String":
            return "'" + str(v).replace("'", "''") + "'"
        if kind == "Boolean":
            return "TRUE" if v else "FALSE"
    return None


def _column(node: Any) -> str | None:
    if isinstance(node, dict) and isinstance(node.get("Column"), str):
        return '"' + node["Column"].replace('"', '""') + '"'
    return None


def _conjuncts(node: Any) -> list[Any]:
    if isinstance(node, dict) and node.get("BinaryExpr", {}).get("op") == "And":
        b = node["BinaryExpr"]
        return _conjuncts(b["left"]) + _conjuncts(b["right"])
    return [node]


def _part(node: Any) -> str | None:
    if "BinaryExpr" in node:
        b = node["BinaryExpr"]
        col, lit = _column(b["left"]), _literal(b["right"])
        if col and lit and b["op"] in _OPS:
            return f"{col} {_OPS[b['op']]} {lit}"
        return None
    fn = node.get("Function", {})
    test = fn.get("function", {}).get("Boolean") if isinstance(fn.get("function"), dict) else None
    if test in ("IsNull", "IsNotNull") and len(fn.get("input", [])) == 1:
        col = _column(fn["input"][0])
        return f"{col} IS {'NOT ' if test == 'IsNotNull' else ''}NULL" if col else None
    return None


def to_filter(predicate: Any) -> str | None:
    """The harness filter for the parts of a Polars predicate it can express, or None."""
    if predicate is None:
        return None
    try:
        tree = json.loads(predicate.meta.serialize(format="json"))
    except Exception:  # a Polars version whose serialisation differs: push nothing
        return None
    parts = [p for p in (_part(n) for n in _conjuncts(tree)) if p is not None]
    return " AND ".join(f"({p})" for p in parts) or None


def scan_harness(client: HarnessClient, table: str, *, version: int | None = None) -> Any:
    """A ``polars.LazyFrame`` over ``table`` at ``version`` (default: the latest, pinned now)."""
    import polars as pl
    from polars.io.plugins import register_io_source

    info = client.flight_info(table, version=version)  # planning only: pins the version
    pinned = client.pinned_version(info)
    schema = pl.from_arrow(info.schema.empty_table()).schema  # type: ignore[union-attr]

    def source(
        with_columns: list[str] | None, predicate: Any, n_rows: int | None, _batch: int | None
    ) -> Iterator[Any]:
        flt = to_filter(predicate)
        # A limit may only go to the gateway when no predicate is left to apply after it.
        limit = n_rows if predicate is None else None
        for batch in client.read_batches(
            table, columns=with_columns, filter=flt, version=pinned, limit=limit
        ):
            frame = pl.from_arrow(batch)
            if predicate is not None:
                frame = frame.filter(predicate)
            yield frame

    return register_io_source(source, schema=schema, explain_name=f"harness:{table}@v{pinned}")
