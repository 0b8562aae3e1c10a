"""A process killed in the middle of a group commit leaves nothing half-applied."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import IO

import pytest

from flight_gateway.catalog import Catalog
from tests.catalog.helpers import table_row_held, wait_for_orphans

WRITERS = 8


def _setup(cat: Catalog) -> int:
    cat.create_table("t", [{"name": "id", "type": "int64"}])
    specs = [
        {"name": f"{ab}{w}", "kind": "files", "state": {"n": 0}}
        for w in range(WRITERS)
        for ab in "ab"
    ]
    return cat.commit("t", "setup", add_sources=specs).version


def _start(url: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.catalog.crash_worker", url, str(WRITERS), *extra],
        stdout=subprocess.PIPE,
        text=True,
    )


def _read_until(out: IO[str] | None, prefix: str, count: int) -> None:
    assert out is not None
    seen = 0
    for line in out:
        seen += line.startswith(prefix)
        if seen >= count:
            return
    raise AssertionError(f"worker exited before printing {count} x {prefix!r}")


def _assert_whole(cat: Catalog, first: int, catalog_url: str) -> None:
    """Versions are gap-free, and at every version each writer's two sources and its external
    state agree: every commit applied completely or not at all."""
    wait_for_orphans(catalog_url)
    current = cat.current_version("t")
    assert [h.version for h in cat.history("t")] == list(range(current, -1, -1))
    for v in range(first, current + 1):
        snap = cat.describe("t", version=v)
        for w in range(WRITERS):
            a, b = snap.source(f"a{w}"), snap.source(f"b{w}")
            assert a.state == b.state, (v, w)
            assert a.state_version == b.state_version == a.state["n"] + 1, (v, w)
            assert snap.external_state.get(f"w{w}", 0) == a.state["n"], (v, w)
    for h in cat.history("t")[:-2]:  # every commit of the workers made exactly its changes
        w, i = h.commit_id.removeprefix("w").split("-")
        assert cat.describe("t", version=h.version).source(f"a{w}").state == {"n": int(i)}


def _still_writable(cat: Catalog) -> None:
    snap = cat.describe("t")
    res = cat.commit(
        "t",
        "after-crash",
        updates=[
            {"source": s.name, "state": s.state, "expect_state_version": s.state_version}
            for s in snap.sources
        ],
    )
    assert res.version == snap.version + 1


@pytest.mark.slow
def test_killed_at_random_while_committing(catalog_url: str) -> None:
    with Catalog(catalog_url) as cat:
        first = _setup(cat)
        proc = _start(catalog_url)
        try:
            _read_until(proc.stdout, "COMMITTED", 60)
            proc.kill()
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
        _assert_whole(cat, first, catalog_url)
        _still_writable(cat)


@pytest.mark.slow
def test_killed_inside_the_group_transaction(catalog_url: str) -> None:
    """The worker dies between the statements of a group's transaction."""
    with Catalog(catalog_url) as cat:
        first = _setup(cat)
        proc = _start(catalog_url, "5")
        try:
            _read_until(proc.stdout, "DYING", 1)
            assert proc.wait(10) == -9
        finally:
            if proc.poll() is None:
                proc.kill()
        _assert_whole(cat, first, catalog_url)
        _still_writable(cat)


@pytest.mark.slow
def test_killed_while_its_group_waits_for_the_table(catalog_url: str) -> None:
    """Commits of a killed process that were already handed to the catalog either all apply or
    none do; their commit ids then return the versions they got."""
    with Catalog(catalog_url) as cat:
        first = _setup(cat)
        proc = _start(catalog_url)
        try:
            _read_until(proc.stdout, "COMMITTED", 20)
            with table_row_held(catalog_url, "t"):
                # Let the writers pile up behind the held table. Not by waiting for the worker's
                # next line: when the hold came before any commit it printed, none comes, and the
                # test hung until pytest's timeout.
                time.sleep(1.0)
                proc.kill()
                proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
        _assert_whole(cat, first, catalog_url)
        _still_writable(cat)
        for h in cat.history("t")[1:-2]:
            again = cat.commit("t", h.commit_id, external_state={"ignored": True})
            assert (again.version, again.applied) == (h.version, False)
