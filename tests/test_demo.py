"""`make demo` keeps working: run the demo script as written, in a scratch directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_runs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    log = out.stderr + out.stdout
    assert "pandas, latest version: 2050 rows" in log
    assert "time travel to version 1: 1700 rows" in log
    assert "'errors': 'pruned'" in log and "rows: 50" in log
    assert "300 rows (no duplicates: True)" in log and "10 new Kafka messages visible" in log
    assert "Spark: 310 rows via harness-flight (client: 310)" in log
    assert "Spark flush: 10 rows Kafka -> Iceberg" in log and "Spark still counts 310" in log
