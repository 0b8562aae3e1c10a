"""A statement's parsed tree is shared read-only by the statements of one text (the service's
``trees`` and ``prepared`` caches): planning and rewriting it must leave it as parsed."""

from __future__ import annotations

import duckdb
import duckdb_extensions
import pytest

from flight_gateway.faces.flightsql import query


@pytest.fixture(scope="module")
def tpcds() -> tuple[list[str], dict[str, set[str]]]:
    con = duckdb.connect()
    duckdb_extensions.import_extension("tpcds", con=con)
    con.execute("CALL dsdgen(sf=0)")
    texts = [str(q) for (q,) in con.execute("SELECT query FROM tpcds_queries()").fetchall()]
    columns: dict[str, set[str]] = {}
    for table, column in con.execute(
        "SELECT table_name, column_name FROM information_schema.columns"
    ).fetchall():
        columns.setdefault(table, set()).add(column)
    return texts, columns


def test_planning_and_rewriting_leave_the_tree_as_parsed(tpcds) -> None:
    texts, columns = tpcds
    for text in texts:
        tree = query.parse(text)
        before = tree.copy()
        refs = query.table_refs(tree)
        query.plan_refs(tree, refs, {r.alias: columns[r.table] for r in refs})
        rewritten = query.rewrite(tree, refs, list(range(len(refs))))
        assert tree == before, text
        assert tree.sql(query.DIALECT) == before.sql(query.DIALECT)
        assert "__harness_0" in rewritten


def test_columns_match_without_case_as_duckdb_does() -> None:
    """An exact name first, else the one equal without case (the first in sorted order)."""
    tree = query.parse("SELECT ID, Region FROM t WHERE REGION = 'a'")
    refs = query.table_refs(tree)
    query.plan_refs(tree, refs, {"t": {"id", "Region", "region", "other"}})
    assert refs[0].columns == {"id", "Region"}
    assert refs[0].filters == ["REGION = 'a'"]
