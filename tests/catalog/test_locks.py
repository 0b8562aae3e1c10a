"""Lease locks: all-or-nothing, fair waiting queue, renew, release, fencing."""

from __future__ import annotations

import threading
import time

import pytest

from flight_gateway.catalog import Catalog
from flight_gateway.protocol.errors import InvalidArgument, LockExpired, LockUnavailable, NotFound


@pytest.fixture
def table(catalog: Catalog) -> Catalog:
    catalog.create_table("t", [{"name": "id", "type": "int64"}])
    catalog.commit("t", "s", add_sources=[{"name": n, "kind": "files"} for n in ("a", "b", "c")])
    return catalog


def test_all_or_nothing(table: Catalog) -> None:
    g = table.lock("t", ["a"], owner="one", ttl_s=30)
    with pytest.raises(LockUnavailable, match="one"):
        table.lock("t", ["a", "b"], owner="two", ttl_s=30)
    # The failed request took nothing: b is still free.
    gb = table.lock("t", ["b"], owner="three", ttl_s=30)
    assert gb.fencing_token > g.fencing_token
    with pytest.raises(NotFound, match="'zzz'"):
        table.lock("t", ["zzz"], owner="x", ttl_s=1)
    with pytest.raises(InvalidArgument):
        table.lock("t", [], owner="x", ttl_s=1)


def test_waiting_lock_granted_on_release(table: Catalog) -> None:
    g = table.lock("t", ["a"], owner="holder", ttl_s=60)
    got: list[str] = []

    def waiter() -> None:
        got.append(table.lock("t", ["a"], owner="waiter", ttl_s=60, wait_s=30).owner)

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.3)
    assert got == []  # still queued
    table.unlock(g.lock_id)
    th.join(20)
    assert got == ["waiter"]


class _Waiters:
    """Requests that wait in threads; ``order`` is the order they were granted in."""

    def __init__(self, table: Catalog) -> None:
        self.table, self.order, self.grants = table, [], {}
        self.threads: dict[str, threading.Thread] = {}

    def ask(self, name: str, sources: list[str], wait_s: float = 30) -> None:
        def run() -> None:
            grant = self.table.lock("t", sources, owner=name, ttl_s=60, wait_s=wait_s)
            self.order.append(name)
            self.grants[name] = grant.lock_id

        self.threads[name] = threading.Thread(target=run)
        self.threads[name].start()
        time.sleep(0.4)  # queued (or granted) before the next request

    def release(self, name: str) -> None:
        self.table.unlock(self.grants[name])

    def wait_for(self, *names: str) -> None:
        for name in names:
            self.threads[name].join(20)


def test_queue_is_fair(table: Catalog) -> None:
    """A waiting request holds its place in the queue of each source, in name order, up to the
    first one it waits for: nobody overtakes it there, and a source it has not reached yet is
    free for others (as if it locked its sources one by one in that order)."""
    g = table.lock("t", ["a"], owner="holder", ttl_s=60)
    q = _Waiters(table)
    q.ask("first", ["a", "b"])  # waits for a; has not reached b
    q.ask("second", ["b"])
    assert q.order == ["second"]  # b was free: granted past 'first', which waits for a
    # c overlaps nobody: granted at once despite the queue.
    assert table.lock("t", ["c"], owner="bystander", ttl_s=5).owner == "bystander"
    q.ask("third", ["a"])  # behind 'first' in a's queue
    table.unlock(g.lock_id)
    time.sleep(0.4)
    # 'first' now has a and waits for b ('second' holds it): nobody overtakes it in either.
    assert q.order == ["second"]
    q.ask("fourth", ["b"])
    assert q.order == ["second"]
    q.release("second")
    q.wait_for("first")
    assert q.order == ["second", "first"]
    q.release("first")
    q.wait_for("third", "fourth")
    assert sorted(q.order[2:]) == ["fourth", "third"]


def test_a_waiter_for_two_sources_does_not_hold_up_the_second_one(table: Catalog) -> None:
    """The move's case: a request for a and b waits behind a's holder; writers of b alone go
    on meanwhile instead of queueing behind it (and so behind every writer of a)."""
    g = table.lock("t", ["a"], owner="writer of a", ttl_s=60)
    q = _Waiters(table)
    q.ask("move", ["a", "b"])
    for i in range(3):
        grant = table.lock("t", ["b"], owner=f"writer of b {i}", ttl_s=60, wait_s=0)
        table.unlock(grant.lock_id)
    assert q.order == []
    table.unlock(g.lock_id)
    q.wait_for("move")
    assert q.order == ["move"]


def test_wait_times_out_and_leaves_no_queue_entry(table: Catalog) -> None:
    table.lock("t", ["a"], owner="holder", ttl_s=60)
    with pytest.raises(LockUnavailable):
        table.lock("t", ["a", "b"], owner="impatient", ttl_s=5, wait_s=0.3)
    # Had the queue entry stayed, b would now be blocked behind it.
    assert table.lock("t", ["b"], owner="next", ttl_s=5).owner == "next"


def test_renew_and_expiry(table: Catalog) -> None:
    g = table.lock("t", ["a"], owner="w", ttl_s=0.6)
    time.sleep(0.3)
    new_expiry = table.renew_lock(g.lock_id, ttl_s=0.6)
    assert new_expiry > g.expires_at
    time.sleep(0.4)  # past the original lease, inside the renewed one
    with pytest.raises(LockUnavailable):
        table.lock("t", ["a"], owner="other", ttl_s=5)
    time.sleep(0.4)
    with pytest.raises(LockExpired):
        table.renew_lock(g.lock_id)
    assert table.lock("t", ["a"], owner="other", ttl_s=5).owner == "other"
    table.unlock(g.lock_id)  # releasing an expired lock is a harmless no-op


def test_a_release_here_wakes_a_waiter_here(
    table: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter in the process that releases the lock tries again at once: with polls ten
    minutes apart it still gets the lock as soon as it is released."""
    from flight_gateway.catalog import locks as locks_module

    monkeypatch.setattr(locks_module, "POLL_CAP_S", 600.0)
    monkeypatch.setattr(table._locks, "_poll_s", 600.0)
    held = table.lock("t", ["a", "b"], owner="holder", ttl_s=60)
    q = _Waiters(table)
    q.ask("waiter", ["b"])
    assert q.order == []
    table.unlock(held.lock_id)
    q.wait_for("waiter")
    assert q.order == ["waiter"]
