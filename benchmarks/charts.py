"""PNG charts of a benchmark run, written beside its Markdown table and linked from it.

One chart per benchmark with ratios: a bar per case, the ratio against the baseline the case
names (1.0 drawn as a line, so "faster than" and "slower than" read at a glance). A row with a
``series`` (``{"t_s": [...], "<name>": [...]}``, e.g. the soak's latency and RSS over time)
gets a line chart of its own.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")[:80]


def _short(label: str, width: int = 72) -> str:
    """Long case names keep their start and their end (where cases of one table differ)."""
    return (
        label
        if len(label) <= width
        else f"{label[: width // 2 - 2]}...{label[-(width // 2 - 1) :]}"
    )


def _ratios(bench: str, rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    labels = [_short(str(r["case"])) for r in rows]
    values = [float(r["ratio"]) for r in rows]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.4))
    colours = ["tab:green" if v >= 1 else "tab:orange" for v in values]
    ax.barh(range(len(rows)), values, color=colours)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    ax.set_xlabel("ratio (1.0 = the case's baseline, higher is better)")
    ax.set_title(bench)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _series(bench: str, row: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    series = row["series"]
    t = series["t_s"]
    names = [k for k in series if k != "t_s"]
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 2.4 * len(names)), sharex=True)
    for ax, name in zip(axes if len(names) > 1 else [axes], names, strict=True):
        ax.plot(t, series[name])
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{bench}: {row['case']}")
    fig.supxlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_charts(rows: Sequence[dict[str, Any]], out: Path, stem: str) -> list[Path]:
    """Draw the run's charts into ``out`` as ``<stem>-<benchmark>.png``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    written = []
    benches = dict.fromkeys(r["benchmark"] for r in rows)
    for bench in benches:
        mine = [r for r in rows if r["benchmark"] == bench]
        with_ratio = [r for r in mine if isinstance(r.get("ratio"), int | float)]
        if with_ratio:
            path = out / f"{stem}-{_safe(bench)}.png"
            _ratios(bench, with_ratio, path)
            written.append(path)
        for i, r in enumerate(x for x in mine if isinstance(x.get("series"), dict)):
            path = out / f"{stem}-{_safe(bench)}-series{i}.png"
            _series(bench, r, path)
            written.append(path)
    return written


def markdown_links(paths: Sequence[Path]) -> str:
    return "".join(f"\n![{p.stem}]({p.name})\n" for p in paths)
