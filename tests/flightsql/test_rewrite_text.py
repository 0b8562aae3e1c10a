"""A statement is rewritten by renaming its table references in its own text (``query.rewrite``,
``_renamed``) when it can be, else from a copy of its tree. The renamed text must mean what the
tree's rewrite means: both run on DuckDB over the same views and give the same rows."""

from __future__ import annotations

import duckdb
import duckdb_extensions
import pytest

from flight_gateway.faces.flightsql import query
from flight_gateway.faces.flightsql.engine import _cte_insert
from flight_gateway.protocol.errors import InvalidArgument


@pytest.fixture(scope="module")
def tpcds() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    duckdb_extensions.import_extension("tpcds", con=con)
    con.execute("CALL dsdgen(sf=0.01)")
    return con


def _both(text: str) -> tuple[str | None, str, list[query.TableRef]]:
    """(the renamed text or None, the tree's rewrite, the refs), views numbered by table."""
    tree = query.parse(text)
    refs = query.table_refs(tree)
    numbers: dict[str, int] = {}
    relation_of = [numbers.setdefault(r.table, len(numbers)) for r in refs]
    renamed = query._renamed(tree, refs, relation_of)
    bare = tree.copy()  # the same tree without its text: rewritten from a copy
    bare.meta.pop(query._TEXT, None)
    return renamed, query.rewrite(bare, refs, relation_of), refs


def _views(con: duckdb.DuckDBPyConnection, refs: list[query.TableRef]) -> None:
    numbers: dict[str, int] = {}
    for r in refs:
        if r.table not in numbers:
            numbers[r.table] = len(numbers)
            quoted = r.table.replace('"', '""')
            con.execute(f'CREATE OR REPLACE TEMP VIEW __harness_{numbers[r.table]} AS '
                        f'SELECT * FROM "{quoted}"')  # fmt: skip


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple]:
    return sorted(con.execute(sql).fetchall(), key=repr)


def test_tpcds_statements_renamed_in_their_text_give_the_trees_rows(tpcds) -> None:
    texts = [str(q) for (q,) in tpcds.execute("SELECT query FROM tpcds_queries()").fetchall()]
    renamed_count = 0
    for text in texts:
        renamed, rewritten, refs = _both(text)
        if renamed is None:
            continue
        renamed_count += 1
        assert query.check_duckdb_functions(renamed) == query.check_duckdb_functions(rewritten)
        con = tpcds.cursor()
        _views(con, refs)
        assert _rows(con, renamed) == _rows(con, rewritten), text
    assert renamed_count == len(texts)  # every TPC-DS statement takes the text path


@pytest.mark.parametrize(
    "text",
    [
        'SELECT "A""b".x FROM "A""b" JOIN t2 ON "A""b".x = t2.x',
        "select t.x, u.x from t, t as u where t.x = u.x;",
        "  with recursive r(n) as (select 1 union all select n + 1 from r where n < 3) "
        "select n, x from r, t order by n, x ;  ",
        "WITH t AS (SELECT 5 AS x) SELECT * FROM t",  # the CTE, not the table: nothing renamed
        "WITH c AS (SELECT x FROM harness.main.t) SELECT count(*) FROM c, main.t2",
        "SELECT x FROM t -- a comment at the end",
        "/* a comment first */ SELECT x FROM t",
        "(SELECT x FROM t) UNION ALL (SELECT x FROM t2 AS t)",
    ],
)
def test_renamed_text_means_the_trees_rewrite(text: str) -> None:
    con = duckdb.connect()
    con.execute('CREATE TABLE "A""b" AS SELECT 1 AS x; CREATE TABLE t AS SELECT range AS x '
                "FROM range(3); CREATE TABLE t2 AS SELECT range AS x FROM range(2)")  # fmt: skip
    try:
        tree = query.parse(text)
        refs = query.table_refs(tree)
    except InvalidArgument:  # reads no harness table: nothing to rewrite
        assert "WITH t AS" in text
        return
    renamed, rewritten, refs = _both(text)
    assert renamed is not None
    assert _cte_insert(renamed) is not None  # the relations go in front as CTEs
    assert "__harness_" in renamed
    _views(con, refs)
    assert _rows(con, renamed) == _rows(con, rewritten)


@pytest.mark.parametrize(
    "text",
    [
        "SELECT x FROM t FOR VERSION AS OF 3",  # a pin in the reference
        "SELECT a FROM t AS u(a)",  # column aliases
    ],
)
def test_references_with_more_than_a_name_are_rewritten_from_the_tree(text: str) -> None:
    tree = query.parse(text)
    refs = query.table_refs(tree)
    assert query._renamed(tree, refs, [0] * len(refs)) is None
    assert "__harness_0" in query.rewrite(tree, refs, [0] * len(refs))


def test_a_tree_with_parameters_bound_is_rewritten_from_the_tree() -> None:
    tree = query.bind_parameters(query.parse("SELECT x FROM t WHERE x = ?"), [2])
    refs = query.table_refs(tree)
    assert query._renamed(tree, refs, [0]) is None
    assert query.rewrite(tree, refs, [0]) == "SELECT x FROM __harness_0 AS t WHERE x = 2"


def test_duckdb_sees_one_statement_or_none_runs() -> None:
    with pytest.raises(InvalidArgument, match="exactly one SQL statement"):
        query.check_duckdb_functions("SELECT 1 FROM __harness_0; SELECT 2 FROM __harness_0")
