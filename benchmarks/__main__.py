"""Run every benchmark, write JSON lines and a Markdown table to ``benchmarks/results/``.

python -m benchmarks [--quick] [--only NAME]
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import pkgutil
import platform
import sys
import time
import traceback
from pathlib import Path

import benchmarks
from benchmarks.charts import markdown_links, write_charts
from benchmarks.services import postgres_server

#: Where results go (``HARNESS_BENCH_RESULTS`` moves them, e.g. for the test of this runner).
RESULTS = Path(os.environ.get("HARNESS_BENCH_RESULTS") or Path(__file__).parent / "results")


def _markdown(rows: list[dict]) -> str:
    cols = ["benchmark", "case", "value", "unit", "ratio", "ratio_vs"]
    extra = ("mb_s", "p50_ms", "p99_ms", "failed", "failures", "retries")
    cols += [c for c in extra if any(c in r for r in rows)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            cells.append(f"{v:.3g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _run_one(name: str, quick: bool, failed: list[str]) -> list[dict]:
    rows: list[dict] = []
    started = time.perf_counter()
    print(f"== {name} ...", flush=True)
    try:
        module = importlib.import_module(f"benchmarks.{name}")
        for row in module.run(quick=quick):
            row = {"benchmark": name.removeprefix("bench_"), **row}
            rows.append(row)
            shown = {k: v for k, v in row.items() if k != "series"}
            print("  ", json.dumps(shown), flush=True)
    except Exception as e:  # the others still run; the exit status reports it
        traceback.print_exc()
        failed.append(name)
        rows.append({"benchmark": name.removeprefix("bench_"), "case": f"FAILED: {e!r}"[:300]})
    print(f"   ({time.perf_counter() - started:.1f}s)", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes, under two minutes")
    parser.add_argument(
        "--only",
        help="run only benchmarks whose module name contains this (or one of these, comma-separated)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rows: list[dict] = []
    names = sorted(
        m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name.startswith("bench_")
    )
    if args.only:
        names = [n for n in names if any(part in n for part in args.only.split(","))]
    failed: list[str] = []
    with postgres_server():
        for name in names:
            rows += _run_one(name, args.quick, failed)
    meta = {
        "when": stamp,
        "quick": args.quick,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    with open(RESULTS / f"{stamp}.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps({**meta, **row}) + "\n")
    table = f"# Benchmark results {stamp}{' (quick)' if args.quick else ''}\n\n" + _markdown(rows)
    (RESULTS / f"{stamp}.md").write_text(table + markdown_links(write_charts(rows, RESULTS, stamp)))
    (RESULTS / "latest.md").write_text(
        table + markdown_links(write_charts(rows, RESULTS, "latest"))
    )
    print(table)
    if failed:
        sys.exit(f"benchmarks failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
