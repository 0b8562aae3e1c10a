"""``heads`` now (what every Flight SQL statement asks twice) is one statement on the pool's
DBAPI connection: the same answer as the SQLAlchemy path, the same errors (NOT_FOUND for an
unknown table, SQLAlchemy's OperationalError, so UNAVAILABLE on the wire, for a broken catalog),
on SQLite and on Postgres."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from flight_gateway.catalog import Catalog, queries
from flight_gateway.protocol.errors import NotFound

#: A moment between the commits ``_filled`` makes: after a1, b1 and c1, before b2.
MOMENTS: dict[int, float] = {}


def _filled(cat: Catalog) -> Catalog:
    for name in ("a", "b", "c"):
        cat.create_table(name, [{"name": "id", "type": "int64"}])
        cat.commit(name, f"{name}1", add_sources=[{"name": "s", "kind": "files", "state": {}}])
    time.sleep(0.01)
    MOMENTS[id(cat)] = time.time()
    time.sleep(0.01)
    cat.commit("b", "b2", updates=[{"source": "s", "state": {"n": 1}}])
    cat.drop_table("c")
    cat.create_table("c", [{"name": "id", "type": "int64"}])  # another incarnation
    return cat


@pytest.fixture(params=["sqlite", "postgres"])
def catalog(request: Any, tmp_path: Path) -> Iterator[Catalog]:
    if request.param == "sqlite":
        with Catalog(f"sqlite:///{tmp_path / 'c.db'}") as cat:
            yield _filled(cat)
        return
    dsn = request.getfixturevalue("pg_dsn")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    with Catalog(f"{dsn}?options=-csearch_path%3D{schema}") as cat:
        yield _filled(cat)


def test_heads_now_answers_as_the_sqlalchemy_path(catalog: Catalog) -> None:
    names = ["c", "a", "b", "a"]
    fast = catalog.heads(names)
    slow = {n: queries.head(catalog.engine, n) for n in names}  # SQLAlchemy's path
    assert set(fast) == {"a", "b", "c"}
    for name in ("a", "b", "c"):
        assert fast[name] == slow[name], name
    assert fast["b"].current_version == 2 and fast["a"].current_version == 1
    assert fast["c"].table_id not in (fast["a"].table_id, fast["b"].table_id)
    assert all(h.version_at is None for h in fast.values())


def test_heads_at_a_moment_answers_as_the_sqlalchemy_path(catalog: Catalog) -> None:
    moment = MOMENTS[id(catalog)]
    at = catalog.heads(["a", "b"], moment)
    for name in ("a", "b"):
        assert at[name] == queries.head(catalog.engine, name, moment), name  # SQLAlchemy's
    assert at["b"].version_at == 1 and at["b"].current_version == 2
    assert catalog.heads(["b"], time.time() + 1)["b"].version_at == 2
    with pytest.raises(NotFound, match="'b' has no version committed at or before"):
        catalog.heads(["b", "a"], moment - 3600)


def test_heads_now_names_the_unknown_table(catalog: Catalog) -> None:
    with pytest.raises(NotFound, match="'nope' does not exist"):
        catalog.heads(["a", "nope"])
    assert catalog.heads(["a"])["a"].current_version == 1  # the connection was given back


def test_a_broken_sqlite_catalog_is_sqlalchemys_operational_error(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    with Catalog(f"sqlite:///{path}") as cat:
        _filled(cat)
        con = sqlite3.connect(path)
        con.execute("ALTER TABLE harness_tables RENAME TO elsewhere")
        con.commit()
        con.close()
        with pytest.raises(OperationalError):  # the Flight face answers UNAVAILABLE for it
            cat.heads(["a"])


def test_heads_after_the_catalog_server_dropped_its_connections(pg_dsn: str) -> None:
    """The pooled connections all died (a Postgres restart): one call fails as SQLAlchemy's
    would (UNAVAILABLE, the pool emptied), the next ones read again."""
    schema, app = f"t_{uuid.uuid4().hex[:12]}", f"heads_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        with Catalog(f"{pg_dsn}?options=-csearch_path%3D{schema}&application_name={app}") as cat:
            _filled(cat)
            for _ in range(3):
                assert cat.heads(["a", "b"])["b"].current_version == 2
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (app,),
            ).fetchone()
            assert killed is not None and killed[0] >= 1
            failed = 0
            for _ in range(3):
                try:
                    assert cat.heads(["a", "b"])["b"].current_version == 2
                except OperationalError as e:
                    assert e.connection_invalidated
                    failed += 1
            assert failed <= 1
            assert cat.heads(["a"])["a"].current_version == 1


def test_the_catalog_clock_is_its_commit_times_clock(catalog: Catalog) -> None:
    """``now`` (one statement on Postgres, none on SQLite) is the clock commits are stamped
    with: a commit made after it is later, one made before is earlier."""
    before = catalog.history("b")[0].committed_at
    now = catalog.now()
    catalog.commit("a", "a2", updates=[{"source": "s", "state": {"n": 2}}])
    after = catalog.history("a")[0].committed_at
    assert before <= now <= after
