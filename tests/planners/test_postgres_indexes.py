"""``harness-gateway maintain`` makes the indexes ``enable_versioning`` makes on tables that a
release before them versioned: the history's index of periods and (PostgreSQL 16 and later) the
table's BRIN index of when rows were written, which a read extending rows it kept uses instead
of a scan of the whole table."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from planners.postgres.versioning import add_missing_indexes, enable_versioning

pytestmark = pytest.mark.integration


def _indexes(conn: psycopg.Connection, *tables: str) -> dict[str, bool]:
    rows = conn.execute(
        "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_class t ON t.oid = i.indrelid WHERE t.relname = ANY(%s)",
        (list(tables),),
    ).fetchall()
    return {name: valid for name, valid in rows}


def test_missing_and_invalid_indexes_are_made_once(pg_dsn: str) -> None:
    table = f"old_{uuid.uuid4().hex[:8]}"
    history = f"{table}_history"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{table}" (id bigint PRIMARY KEY, v text)')
        enable_versioning(conn, table)
        conn.execute(f"INSERT INTO \"{table}\" SELECT g, 'v' FROM generate_series(1, 1000) g")
        wanted = {f"{history}_period"}
        if conn.info.server_version >= 160000:
            wanted.add(f"{table}_written")
        assert wanted <= set(_indexes(conn, table, history))
        for name in wanted:  # as a release before them left the table
            conn.execute(f'DROP INDEX "{name}"')
        # A failed concurrent build leaves an invalid index behind: built again.
        conn.execute(f'UPDATE "{table}" SET v = \'w\' WHERE id = 1')
        conn.execute(f'INSERT INTO "{history}" SELECT * FROM "{history}"')  # a duplicate row
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(
                f'CREATE UNIQUE INDEX CONCURRENTLY "{history}_period" ON "{history}" (id)'
            )
        assert _indexes(conn, history)[f"{history}_period"] is False

        made = add_missing_indexes(conn, "public", table, history)
        assert set(made) == {f"public.{name}" for name in wanted}
        found = _indexes(conn, table, history)
        assert all(found[name] for name in wanted)
        assert add_missing_indexes(conn, "public", table, history) == []
        # An unversioned table gets none.
        plain = f"plain_{uuid.uuid4().hex[:8]}"
        conn.execute(f'CREATE TABLE "{plain}" (id bigint)')
        assert add_missing_indexes(conn, "public", plain, f"{plain}_history") == []
