"""A Parquet file's footer is read once while the file is unchanged: relations planned for
other column sets of the same files reuse it, and a file rewritten in place is read again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import duckdb

from flight_gateway.faces.flightsql import engine
from flight_gateway.faces.flightsql.workers import Plan


class _Counted:
    """The builder's metadata cursor, counting the footer reads."""

    def __init__(self, cursor: Any) -> None:
        self.cursor, self.reads = cursor, 0

    def execute(self, sql: str, params: Any = None) -> Any:
        self.reads += "parquet_schema" in sql
        return self.cursor.execute(sql, params)

    def close(self) -> None:
        self.cursor.close()


def _footers(files: list[str]) -> tuple[dict[str, Any], int]:
    builder = engine.Builder(Plan("SELECT 1"))
    counted = _Counted(engine.metadata())
    builder._meta = counted
    try:
        return builder._footers(files), counted.reads
    finally:
        counted.close()


def _write(path: Path, select: str) -> None:
    duckdb.connect().execute(f"COPY ({select}) TO '{path}'")


def test_a_footer_is_read_once_while_its_file_is_unchanged(tmp_path: Path) -> None:
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    _write(a, "SELECT 1 AS x, 'p' AS y")
    _write(b, "SELECT 2 AS x")
    first, reads = _footers([str(a)])
    assert first == {str(a): [("x", None), ("y", None)]} and reads == 1
    again, reads = _footers([str(a), str(b)])  # only b's is read
    assert again[str(a)] == first[str(a)] and again[str(b)] == [("x", None)] and reads == 1
    _, reads = _footers([str(b), str(a)])
    assert reads == 0
    _write(a, "SELECT 1 AS z")  # rewritten in place: another size and time
    st = os.stat(a)
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    changed, reads = _footers([str(a)])
    assert changed == {str(a): [("z", None)]} and reads == 1
