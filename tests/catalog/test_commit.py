"""Commit semantics of DESIGN.md §3 on both catalog backends."""

from __future__ import annotations

import time

import pytest

from flight_gateway.catalog import Catalog
from flight_gateway.protocol.errors import (
    AlreadyExists,
    Conflict,
    InvalidArgument,
    LockExpired,
    NotFound,
)

SCHEMA = [
    {"name": "id", "type": "int64", "nullable": False},
    {"name": "level", "type": "string"},
    {"name": "n", "type": "int32"},
]


@pytest.fixture
def logs(catalog: Catalog) -> Catalog:
    catalog.create_table("ns.logs", SCHEMA, partition_by=["level"], properties={"owner": "ops"})
    catalog.commit(
        "ns.logs",
        "add",
        add_sources=[
            {
                "name": "kafka-0",
                "kind": "kafka",
                "partition": {"level": "ERROR"},
                "config": {"topic": "logs", "partition": 0},
                "state": {"low": 0, "high": 0},
            },
            {"name": "ice", "kind": "iceberg", "state": {"snapshot_id": None}},
        ],
    )
    return catalog


def test_create_and_describe_version_zero(catalog: Catalog) -> None:
    res = catalog.create_table("logs", SCHEMA, primary_key=["id"])
    assert (res.version, res.schema_id) == (0, 0)
    snap = catalog.describe("logs")
    assert snap.version == 0 and snap.sources == ()
    assert [(f.id, f.name, f.type, f.nullable) for f in snap.schema.fields] == [
        (1, "id", "int64", False),
        (2, "level", "string", True),
        (3, "n", "int32", True),
    ]
    assert snap.primary_key == ("id",)
    assert catalog.list_tables() == ["logs"]


def test_create_errors(catalog: Catalog) -> None:
    catalog.create_table("logs", SCHEMA)
    with pytest.raises(AlreadyExists, match="logs"):
        catalog.create_table("logs", SCHEMA)
    with pytest.raises(InvalidArgument, match="invalid table name"):
        catalog.create_table("bad name; drop", SCHEMA)
    with pytest.raises(InvalidArgument, match="duplicate column"):
        catalog.create_table("x", [*SCHEMA, {"name": "id", "type": "int32"}])
    with pytest.raises(InvalidArgument, match="unknown Arrow type"):
        catalog.create_table("x", [{"name": "a", "type": "int65"}])
    with pytest.raises(InvalidArgument, match="partition_by column 'nope'"):
        catalog.create_table("x", SCHEMA, partition_by=["nope"])
    with pytest.raises(NotFound, match="'missing'"):
        catalog.describe("missing")
    assert catalog.list_tables() == ["logs"]


def test_pinned_versions_keep_old_states_after_many_commits(logs: Catalog) -> None:
    for i in range(1, 101):
        logs.commit(
            "ns.logs",
            f"c{i}",
            updates=[{"source": "kafka-0", "state": {"low": 0, "high": i * 10}}],
            external_state={"consumer.offset": i * 10},
        )
    assert logs.current_version("ns.logs") == 101
    for v in (1, 2, 50, 101):
        snap = logs.describe("ns.logs", version=v)
        assert snap.source("kafka-0").state == {"low": 0, "high": (v - 1) * 10}
        assert snap.source("ice").state == {"snapshot_id": None}
        expected_ext = {} if v == 1 else {"consumer.offset": (v - 1) * 10}
        assert snap.external_state == expected_ext
        assert snap.properties == {"owner": "ops"}


def test_move_commit_updates_two_sources_atomically(logs: Catalog) -> None:
    logs.commit("ns.logs", "fill", updates=[{"source": "kafka-0", "state": {"low": 0, "high": 50}}])
    res = logs.commit(
        "ns.logs",
        "flush-1",
        updates=[
            {"source": "ice", "state": {"snapshot_id": 111}, "expect_state_version": 1},
            {"source": "kafka-0", "state": {"low": 50, "high": 50}, "expect_state_version": 2},
        ],
        summary={"operation": "kafka-flush"},
    )
    before, after = logs.describe("ns.logs", version=res.version - 1), logs.describe("ns.logs")
    assert before.source("kafka-0").state == {"low": 0, "high": 50}
    assert before.source("ice").state == {"snapshot_id": None}
    assert after.source("kafka-0").state == {"low": 50, "high": 50}
    assert after.source("ice").state == {"snapshot_id": 111}
    assert logs.history("ns.logs", limit=1)[0].summary["operation"] == "kafka-flush"


def test_failed_commit_changes_nothing(logs: Catalog) -> None:
    before = logs.describe("ns.logs")
    # The first update is valid, the second names a missing source: nothing may apply.
    with pytest.raises(NotFound, match="'nope'"):
        logs.commit(
            "ns.logs",
            "bad",
            updates=[
                {"source": "kafka-0", "state": {"low": 0, "high": 5}},
                {"source": "nope", "state": {}},
            ],
            external_state={"k": 1},
        )
    with pytest.raises(Conflict, match="state version 1, expected 7"):
        logs.commit(
            "ns.logs",
            "bad2",
            updates=[{"source": "kafka-0", "state": {"high": 9}, "expect_state_version": 7}],
            schema_changes=[{"op": "add_column", "name": "x", "type": "string"}],
        )
    with pytest.raises(InvalidArgument, match="not a safe widening"):
        logs.commit(
            "ns.logs",
            "bad3",
            updates=[{"source": "kafka-0", "state": {"high": 9}}],
            schema_changes=[{"op": "widen_type", "name": "n", "type": "int16"}],
        )
    after = logs.describe("ns.logs")
    assert after == before
    assert len(logs.history("ns.logs")) == 2
    # The failed commit_ids were not consumed: they can be used for a valid commit.
    assert logs.commit("ns.logs", "bad", external_state={"k": 1}).applied


def test_repeated_commit_id_applies_once(logs: Catalog) -> None:
    first = logs.commit("ns.logs", "once", updates=[{"source": "kafka-0", "state": {"high": 1}}])
    again = logs.commit("ns.logs", "once", updates=[{"source": "kafka-0", "state": {"high": 1}}])
    assert first.applied and not again.applied and first.version == again.version
    assert logs.current_version("ns.logs") == first.version
    assert logs.describe("ns.logs").source("kafka-0").state_version == 2


def test_add_and_remove_sources_are_versioned(logs: Catalog) -> None:
    v_add = logs.commit(
        "ns.logs",
        "add2",
        add_sources=[
            {
                "name": "kafka-1",
                "kind": "kafka",
                "partition": {"level": "INFO"},
                "state": {"low": 0, "high": 0},
            }
        ],
    ).version
    v_rm = logs.commit("ns.logs", "rm0", remove_sources=["kafka-0"]).version
    assert [s.name for s in logs.describe("ns.logs", version=v_add - 1).sources] == [
        "kafka-0",
        "ice",
    ]
    assert [s.name for s in logs.describe("ns.logs", version=v_add).sources] == [
        "kafka-0",
        "ice",
        "kafka-1",
    ]
    assert [s.name for s in logs.describe("ns.logs", version=v_rm).sources] == ["ice", "kafka-1"]
    with pytest.raises(NotFound):
        logs.commit("ns.logs", "x", updates=[{"source": "kafka-0", "state": {}}])
    with pytest.raises(AlreadyExists):
        logs.commit("ns.logs", "y", add_sources=[{"name": "ice", "kind": "iceberg"}])
    with pytest.raises(InvalidArgument, match="partition keys"):
        logs.commit(
            "ns.logs", "z", add_sources=[{"name": "f", "kind": "files", "partition": {"day": 1}}]
        )
    # A removed name can be added again as a new source with fresh state.
    logs.commit(
        "ns.logs",
        "re",
        add_sources=[{"name": "kafka-0", "kind": "kafka", "state": {"low": 7, "high": 7}}],
    )
    assert logs.describe("ns.logs").source("kafka-0").state_version == 1
    assert logs.describe("ns.logs", version=v_add).source("kafka-0").state == {"low": 0, "high": 0}


def test_schema_change_visible_only_from_its_version(logs: Catalog) -> None:
    v0 = logs.current_version("ns.logs")
    res = logs.evolve_schema(
        "ns.logs",
        "evolve-1",
        [
            {"op": "add_column", "name": "msg", "type": "string"},
            {"op": "rename_column", "name": "n", "new_name": "count"},
            {"op": "widen_type", "name": "count", "type": "int64"},
        ],
    )
    assert res.schema_id == 1 and res.version == v0 + 1
    old, new = logs.describe("ns.logs", version=v0), logs.describe("ns.logs")
    assert [(f.id, f.name, f.type) for f in old.schema.fields] == [
        (1, "id", "int64"),
        (2, "level", "string"),
        (3, "n", "int32"),
    ]
    assert [(f.id, f.name, f.type) for f in new.schema.fields] == [
        (1, "id", "int64"),
        (2, "level", "string"),
        (3, "count", "int64"),
        (4, "msg", "string"),
    ]
    logs.evolve_schema("ns.logs", "evolve-2", [{"op": "drop_column", "name": "msg"}])
    logs.evolve_schema(
        "ns.logs", "evolve-3", [{"op": "add_column", "name": "msg", "type": "string"}]
    )
    # A re-added column gets a new id, so data written under the dropped one never shows up.
    assert logs.describe("ns.logs").schema.field("msg").id == 5
    with pytest.raises(InvalidArgument, match="partition or primary-key"):
        logs.evolve_schema("ns.logs", "e4", [{"op": "drop_column", "name": "level"}])


def test_time_travel_by_timestamp(logs: Catalog) -> None:
    logs.commit("ns.logs", "a", updates=[{"source": "kafka-0", "state": {"high": 1}}])
    t_mid = logs.describe("ns.logs").committed_at
    time.sleep(0.05)
    logs.commit("ns.logs", "b", updates=[{"source": "kafka-0", "state": {"high": 2}}])
    assert logs.describe("ns.logs", as_of=t_mid).source("kafka-0").state == {"high": 1}
    assert logs.describe("ns.logs", as_of=time.time() + 60).source("kafka-0").state == {"high": 2}
    with pytest.raises(NotFound, match="at or before"):
        logs.describe("ns.logs", as_of=0.0)
    with pytest.raises(NotFound, match="no version 99"):
        logs.describe("ns.logs", version=99)


def test_lock_fencing_and_expiry(logs: Catalog) -> None:
    grant = logs.lock("ns.logs", ["kafka-0"], owner="mover", ttl_s=0.5)
    before = logs.describe("ns.logs")
    # Another writer cannot touch a locked source without the lock.
    with pytest.raises(Conflict, match="locked by 'mover'"):
        logs.commit("ns.logs", "intruder", updates=[{"source": "kafka-0", "state": {"high": 1}}])
    # Disjoint sources stay writable.
    logs.commit("ns.logs", "other", updates=[{"source": "ice", "state": {"snapshot_id": 1}}])
    ok = logs.commit(
        "ns.logs",
        "with-lock",
        lock_id=grant.lock_id,
        fencing_token=grant.fencing_token,
        updates=[{"source": "kafka-0", "state": {"high": 1}}],
    )
    assert ok.applied
    time.sleep(0.7)
    mid = logs.describe("ns.logs")
    with pytest.raises(LockExpired, match="expired"):
        logs.commit(
            "ns.logs",
            "late",
            lock_id=grant.lock_id,
            updates=[{"source": "kafka-0", "state": {"high": 2}}],
        )
    assert logs.describe("ns.logs") == mid != before
    # A newer grant supersedes the old lock; its token is larger.
    g2 = logs.lock("ns.logs", ["kafka-0"], owner="mover-2", ttl_s=30)
    assert g2.fencing_token > grant.fencing_token
    with pytest.raises(LockExpired, match="stale"):
        logs.commit(
            "ns.logs",
            "stale",
            lock_id=g2.lock_id,
            fencing_token=grant.fencing_token,
            updates=[{"source": "kafka-0", "state": {"high": 3}}],
        )


def test_retention_keeps_newer_versions_intact(logs: Catalog) -> None:
    for i in range(1, 21):
        updates = [{"source": "kafka-0", "state": {"high": i}}]
        if i % 5 == 0:
            updates.append({"source": "ice", "state": {"snapshot_id": i}})
        logs.commit(
            "ns.logs", f"c{i}", updates=updates, external_state={"off": i} if i == 3 else None
        )
    logs.commit("ns.logs", "rm", remove_sources=["ice"])
    current = logs.current_version("ns.logs")
    expected = {v: logs.describe("ns.logs", version=v) for v in range(current - 9, current + 1)}
    assert logs.expire_versions("ns.logs", keep_last=10) == current - 9
    for v, snap in expected.items():
        assert logs.describe("ns.logs", version=v) == snap
    with pytest.raises(NotFound, match="expired"):
        logs.describe("ns.logs", version=current - 10)
    assert logs.expire_versions("ns.logs", before=time.time() + 10) == 9
    assert logs.describe("ns.logs") == expected[current]
    assert [h.version for h in logs.history("ns.logs")] == [current]


def test_drop_table(logs: Catalog) -> None:
    logs.drop_table("ns.logs")
    assert logs.list_tables() == []
    with pytest.raises(NotFound):
        logs.drop_table("ns.logs")
    logs.create_table("ns.logs", SCHEMA)
    assert logs.describe("ns.logs").sources == ()


def test_reopen_and_newer_catalog_schema(catalog_url: str) -> None:
    from sqlalchemy import update

    from flight_gateway.catalog.db import SCHEMA_VERSION, catalog_info
    from flight_gateway.protocol.errors import HarnessError

    with Catalog(catalog_url) as a:
        a.create_table("t", SCHEMA)
    with Catalog(catalog_url) as b:  # opening an existing catalog migrates nothing, loses nothing
        assert b.list_tables() == ["t"]
        with b.engine.begin() as conn:
            conn.execute(update(catalog_info).values(schema_version=SCHEMA_VERSION + 1))
    with pytest.raises(HarnessError, match="newer than this release"):
        Catalog(catalog_url)
