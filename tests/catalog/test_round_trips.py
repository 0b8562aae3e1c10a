"""On Postgres a commit, a lock, a renewal and an unlock are one statement each, sent on an
autocommit connection (no BEGIN/COMMIT, no ping): one round trip each (DESIGN.md §12)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import event

from flight_gateway.catalog import Catalog


@pytest.fixture
def pg_catalog(pg_dsn: str) -> Any:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    with Catalog(f"{pg_dsn}?options=-csearch_path%3D{schema}") as cat:
        cat.create_table("t", [{"name": "id", "type": "int64"}])
        cat.commit("t", "setup", add_sources=[{"name": "s", "kind": "files", "state": {"n": 0}}])
        yield cat


def _count_statements(cat: Catalog) -> list[str]:
    seen: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    for engine in (cat.engine, cat._fast):
        event.listen(engine, "before_cursor_execute", before)
    return seen


def test_lock_commit_renew_unlock_one_statement_each(pg_catalog: Catalog) -> None:
    cat = pg_catalog
    fast = cat._fast
    assert fast is not None
    with fast.connect() as conn:  # warm the pool so the counts below are steady state
        conn.exec_driver_sql("SELECT 1")
    seen = _count_statements(cat)
    grant = cat.lock("t", ["s"], "w", ttl_s=30)
    assert len(seen) == 1 and "harness_lock_step" in seen[0], seen
    seen.clear()
    res = cat.commit(
        "t",
        "c1",
        updates=[{"source": "s", "state": {"n": 1}}],
        lock_id=grant.lock_id,
        fencing_token=grant.fencing_token,
    )
    assert res.applied and len(seen) == 1 and "harness_commit_group" in seen[0], seen
    seen.clear()
    cat.renew_lock(grant.lock_id, 60)
    cat.unlock(grant.lock_id)
    assert len(seen) == 2, seen
    assert cat.describe("t").source("s").state == {"n": 1}


def test_autocommit_engine_sends_no_transaction_statements(pg_catalog: Catalog) -> None:
    """psycopg in autocommit mode sends neither BEGIN nor COMMIT around the statement."""
    fast = pg_catalog._fast
    assert fast is not None
    with fast.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None and raw.autocommit is True  # type: ignore[attr-defined]
    assert fast.pool._pre_ping is False  # type: ignore[attr-defined]
