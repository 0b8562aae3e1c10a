"""``benchmarks/bench_tpch_sql.py`` in quick mode keeps working (it compares every answer with
DuckDB's itself); no timing is asserted here."""

from __future__ import annotations

import pytest

from benchmarks import bench_tpch_sql

pytestmark = pytest.mark.integration


def test_quick_bench_runs_and_reports_every_query() -> None:
    rows = bench_tpch_sql.run(quick=True)
    cases = {r["case"] for r in rows}
    assert "22 queries via Flight SQL (ADBC)" in cases
    assert "22 queries via Flight SQL (ADBC), cold kinds only" in cases
    assert sum(1 for c in cases if c.startswith("q")) == 44
    memory = next(r for r in rows if r["case"].startswith("SELECT * FROM lineitem"))
    assert memory["unit"] == "MB"
