"""Comparative benchmarks: each ``bench_*.py`` module has ``run(quick: bool) -> list[dict]``."""
