"""``make bench QUICK=1`` writes PNG charts beside ``latest.md`` and links them from it (the
runner on one quick benchmark, into a temporary results directory); and a time series (the
soak's latency and RSS) becomes a line chart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.charts import write_charts

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def _valid_png(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG
    height, width = matplotlib.image.imread(path).shape[:2]
    assert height > 50 and width > 50


@pytest.mark.slow
@pytest.mark.integration
def test_quick_bench_writes_linked_charts(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "merge_on_read"],
        env={**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_BENCH_RESULTS": str(tmp_path)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    latest = (tmp_path / "latest.md").read_text()
    assert "![latest-merge_on_read](latest-merge_on_read.png)" in latest
    _valid_png(tmp_path / "latest-merge_on_read.png")


def test_series_rows_become_line_charts(tmp_path: Path) -> None:
    rows = [
        {"benchmark": "soak", "case": "reads", "value": 1, "ratio": 1.2, "ratio_vs": "start"},
        {
            "benchmark": "soak",
            "case": "over time",
            "value": 0,
            "series": {"t_s": [0, 60, 120], "read_p50_ms": [5, 6, 5.5], "rss_mb": [300, 310, 305]},
        },
    ]
    paths = write_charts(rows, tmp_path, "latest")
    assert [p.name for p in paths] == ["latest-soak.png", "latest-soak-series0.png"]
    for p in paths:
        _valid_png(p)
