"""Lock ids are capabilities: only the lock's holder learns them (issue 10, item 5)."""

from __future__ import annotations

import json
import time

import pytest

from flight_gateway.catalog import Catalog, LockInfo
from flight_gateway.protocol.errors import Conflict, InvalidArgument


@pytest.fixture
def table(catalog: Catalog) -> Catalog:
    catalog.create_table("t", [{"name": "id", "type": "int64"}])
    catalog.commit("t", "s", add_sources=[{"name": n, "kind": "files"} for n in ("a", "b")])
    return catalog


def test_lock_id_not_in_history_summary(table: Catalog) -> None:
    g = table.lock("t", ["a"], owner="mover", ttl_s=30)
    table.commit("t", "locked", lock_id=g.lock_id, updates=[{"source": "a", "state": {"x": 1}}])
    for c in table.history("t"):
        assert g.lock_id not in json.dumps(c.to_json())


def test_conflict_names_owner_not_lock_id(table: Catalog) -> None:
    g = table.lock("t", ["a"], owner="mover", ttl_s=30)
    with pytest.raises(Conflict) as e:
        table.commit("t", "intruder", updates=[{"source": "a", "state": {"x": 1}}])
    assert "'mover'" in str(e.value) and g.lock_id not in str(e.value)


def test_lock_info(table: Catalog) -> None:
    before = time.time()
    g = table.lock("t", ["b", "a"], owner="mover", ttl_s=30)
    info = table.lock_info(g.lock_id)
    assert info == LockInfo(
        lock_id=g.lock_id,
        table="t",
        owner="mover",
        sources=("a", "b"),
        granted=True,
        fencing_token=g.fencing_token,
        expires_at=g.expires_at,
    )
    assert before + 29 < info.expires_at < time.time() + 31
    table.unlock(g.lock_id)
    assert table.lock_info(g.lock_id) is None
    assert table.lock_info("no-such-lock") is None


def test_wait_is_capped(catalog_url: str) -> None:
    with Catalog(catalog_url, max_wait_s=5) as cat:
        cat.create_table("t", [{"name": "id", "type": "int64"}])
        cat.commit("t", "s", add_sources=[{"name": "a", "kind": "files"}])
        with pytest.raises(InvalidArgument, match="wait_s"):
            cat.lock("t", ["a"], owner="w", ttl_s=5, wait_s=6)
        with pytest.raises(InvalidArgument, match="wait_s"):
            cat.lock("t", ["a"], owner="w", ttl_s=5, wait_s=-1)
        # The refused requests took nothing.
        assert cat.lock("t", ["a"], owner="w", ttl_s=5, wait_s=5).owner == "w"
