"""Write leases held longer than their length stay held: one thread renews every lease of the
process (``core.write.lease``), each at a third of its length, and stops with its release, so
no renewal follows the unlock."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from flight_gateway.catalog import Catalog
from flight_gateway.core.write import lease


def test_leases_outlive_their_length_and_end_with_their_release(tmp_path: Path) -> None:
    with Catalog(f"sqlite:///{tmp_path / 'c.db'}") as cat:
        cat.create_table("t", [{"name": "id", "type": "int64"}])
        cat.commit("t", "s", add_sources=[
            {"name": n, "kind": "files", "state": {}} for n in ("a", "b", "c")
        ])  # fmt: skip
        held: dict[str, str] = {}
        errors: list[BaseException] = []

        def hold(source: str, seconds: float) -> None:
            try:
                with lease.leased(cat, "t", [source], owner=f"test:{source}", ttl_s=0.6,
                                  wait_s=5) as grant:  # fmt: skip
                    held[source] = grant.lock_id
                    time.sleep(seconds)  # three times the lease and more
                    cat.commit("t", f"w-{source}", lock_id=grant.lock_id,
                               updates=[{"source": source, "state": {"n": 1}}])  # fmt: skip
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [
            threading.Thread(target=hold, args=(s, d))
            for s, d in (("a", 2.0), ("b", 1.0), ("c", 2.5))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert {c.commit_id for c in cat.history("t")} >= {"w-a", "w-b", "w-c"}
        for lock_id in held.values():
            assert cat.lock_info(lock_id) is None  # released, and not renewed after
        time.sleep(0.5)
        assert cat.list_locks("t") == []
        assert not lease._RENEWALS._held


class _SlowCatalog:
    """Stands in for a catalog whose renewals of one lease stall (a locked SQLite file, a
    network stall): only ``renew_lock`` is called."""

    def __init__(self, stall: threading.Event) -> None:
        self.stall, self.renewed = stall, Counter[str]()

    def renew_lock(self, lock_id: str, ttl_s: float) -> float:
        if lock_id == "slow":
            self.stall.wait(10)
        self.renewed[lock_id] += 1
        return time.time() + ttl_s


def test_a_stalled_renewal_delays_no_other_lease() -> None:
    renewals = lease._Renewals()
    stall = threading.Event()
    cat: Any = _SlowCatalog(stall)
    renewals.add(cat, "slow", 0.3)
    renewals.add(cat, "fast", 0.3)
    time.sleep(1.0)
    assert cat.renewed["fast"] >= 3  # every 0.1 s, while "slow" has not returned once
    assert cat.renewed["slow"] == 0
    started = time.monotonic()
    renewals.remove("fast")
    assert time.monotonic() - started < 0.5
    done = threading.Thread(target=renewals.remove, args=("slow",))
    done.start()
    done.join(0.3)
    assert done.is_alive()  # waits for the renewal under way: none is sent after the unlock
    stall.set()
    done.join(5)
    assert not done.is_alive() and cat.renewed["slow"] == 1
