"""Buffers a client gets over Flight are aligned for Acero: DuckDB over the client's table and
a ``flight`` source's residual filter run with Acero set to fail on any poorly aligned buffer
(they warned once per column and batch before the client asked the IPC reader to realign)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_reads_hand_acero_aligned_buffers() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tests.gateway.alignment_worker"],
        env={**os.environ, "PYTHONPATH": str(ROOT), "ACERO_ALIGNMENT_HANDLING": "error"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "aligned" in out.stdout
    assert "poorly aligned" not in out.stderr
