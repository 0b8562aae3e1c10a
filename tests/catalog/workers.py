"""Functions run in separate processes by the concurrency tests (must be importable)."""

from __future__ import annotations

import os
import sys
import time

from flight_gateway.catalog import Catalog


def commit_many(url: str, table: str, source: str, n: int) -> list[int]:
    """Commit ``n`` state updates to one source; returns the versions produced."""
    cat = Catalog(url)
    try:
        return commit_many_with(cat, table, source, n)
    finally:
        cat.close()


def commit_many_with(cat: Catalog, table: str, source: str, n: int) -> list[int]:
    """``commit_many`` through a catalog the caller shares with other threads."""
    out = []
    for i in range(n):
        res = cat.commit(
            table,
            f"{source}-{i}",
            updates=[{"source": source, "state": {"high": i + 1}, "expect_state_version": i + 1}],
        )
        out.append(res.version)
    return out


def hold_lock_then_hang(url: str, table: str, source: str, ttl_s: float) -> None:
    """Take a lock, report it on stdout, then hang until killed."""
    cat = Catalog(url)
    grant = cat.lock(table, [source], owner=f"pid-{os.getpid()}", ttl_s=ttl_s)
    sys.stdout.write(f"LOCKED {grant.lock_id}\n")
    sys.stdout.flush()
    time.sleep(3600)


if __name__ == "__main__":
    hold_lock_then_hang(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
