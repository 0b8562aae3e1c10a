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


def test_queue_is_fair(table: Catalog) -> None:
    g = table.lock("t", ["a"], owner="holder", ttl_s=60)
    order: list[str] = []
    grants: dict[str, str] = {}

    def waiter(name: str, sources: list[str]) -> None:
        grant = table.lock("t", sources, owner=name, ttl_s=60, wait_s=30)
        order.append(name)
        grants[name] = grant.lock_id

    first = threading.Thread(target=waiter, args=("first", ["a", "b"]))
    first.start()
    time.sleep(0.3)
    # 'second' wants only b, which is free, but 'first' queued earlier for a+b: it must wait.
    second = threading.Thread(target=waiter, args=("second", ["b"]))
    second.start()
    time.sleep(0.3)
    assert order == []
    # c overlaps nobody: granted at once despite the queue.
    assert table.lock("t", ["c"], owner="bystander", ttl_s=5).owner == "bystander"
    table.unlock(g.lock_id)
    first.join(20)
    assert order == ["first"]
    table.unlock(grants["first"])
    second.join(20)
    assert order == ["first", "second"]


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
