"""Read-only SQL over harness tables: parsing, checking, pinning and rewriting a statement.

A statement is parsed with sqlglot. Every harness table it references is planned once per
statement at a pinned version (``flight_gateway.flightsql.relations``: the caller's permissions,
pruning and pushdown apply) and becomes a view DuckDB scans (``engine``); the statement is
rewritten to name those views. What is pushed into each table's planning:

- the columns the query uses of that table (all of them under ``*``);
- the top-level ``WHERE`` conjuncts that name only that table's columns, when the query has no
  outer join (pushing a conjunct below an outer join could change its result); DuckDB still
  applies the whole ``WHERE``, so a conjunct the harness cannot take is simply not pushed.

Pinning: by default all tables of one statement are read as of one moment (the catalog's clock
when the statement is planned), so a join sees a consistent cut even while movers commit.
``FROM t FOR VERSION AS OF 12`` or ``FOR TIMESTAMP AS OF '2026-11-24T10:00:00Z'`` pins one table
explicitly. The pins travel in the statement handle, so running a handle again (on any replica
sharing the ticket key) reads exactly the same versions.

DuckDB runs with external access disabled once the views exist: a query cannot read other
files, attach databases or load extensions; it sees only the harness relations. Table functions are refused,
and so are functions that reveal the gateway's environment (``current_setting``,
``getvariable``, ``version``, ``duckdb_*``, ``pragma_*``, ``pg_*``, ...: ``denied``), checked on
sqlglot's parse and again on DuckDB's own parse of the SQL it runs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp

from flight_gateway.errors import InvalidArgument, NotFound
from flight_gateway.protocol import ReadRequest
from flight_gateway.protocol.messages import parse_timestamp

log = logging.getLogger(__name__)

CATALOG = "harness"
SCHEMA = "main"
DIALECT = "duckdb"


@dataclass
class TableRef:
    """One table reference of the statement (a self-join has two)."""

    node: exp.Table
    table: str  # harness table name
    alias: str
    version: int | None = None
    as_of: float | None = None
    columns: set[str] | None = field(default_factory=set)  # None: every column
    filters: list[str] = field(default_factory=list)


#: Functions that reveal the gateway's environment (settings, variables, paths, versions,
#: catalogs, the connection or the running query) or run SQL given as text.
DENIED_FUNCTIONS = frozenset(
    {
        "current_setting",
        "getvariable",
        "getenv",
        "version",
        "current_version",
        "current_query",
        "current_query_id",
        "current_connection_id",
        "current_transaction_id",
        "txid_current",
        "current_database",
        "current_catalog",
        "current_schema",
        "current_schemas",
        "current_role",
        "current_user",
        "session_user",
        "user",
        "in_search_path",
        "which_secret",
        "col_description",
        "obj_description",
        "shobj_description",
        "format_pg_type",
        "map_to_pg_oid",
        "query",
        "query_table",
        "json_execute_serialized_sql",
    }
)
DENIED_PREFIXES = ("duckdb_", "pragma_", "pg_")
DENIED_SUFFIXES = ("_privilege",)


def denied(function: str) -> bool:
    name = function.lower()
    return (
        name in DENIED_FUNCTIONS
        or name.startswith(DENIED_PREFIXES)
        or name.endswith(DENIED_SUFFIXES)
    )


def _refuse(function: str) -> InvalidArgument:
    return InvalidArgument(
        f"function {function.lower()}() is not allowed: it reveals the gateway's settings or "
        "environment"
    )


def check_functions(tree: exp.Query) -> None:
    """Refuse the ``denied`` functions anywhere in the statement."""
    for node in tree.find_all(exp.Func):
        name = node.name if isinstance(node, exp.Anonymous) else node.sql_name()
        if denied(name):
            raise _refuse(name)


def harness_name(node: exp.Table) -> str:
    """``events``, ``main.events``, ``harness.main.events`` -> ``events``; ``ns.logs`` (a
    namespaced harness table) stays ``ns.logs``."""
    db, catalog = node.db, node.catalog
    if catalog and catalog != CATALOG:
        raise NotFound(f"unknown catalog {catalog!r} (this server has {CATALOG!r})")
    if db and db != SCHEMA:
        return f"{db}.{node.name}"
    return node.name


def parse(sql: str) -> exp.Query:
    try:
        trees = sqlglot.parse(sql, read=DIALECT)
    except sqlglot.errors.ParseError as e:
        raise InvalidArgument(f"cannot parse the SQL statement: {e}") from e
    trees = [t for t in trees if t is not None]
    if len(trees) != 1:
        raise InvalidArgument(f"give exactly one SQL statement, got {len(trees)}")
    tree: Any = trees[0]
    if not isinstance(tree, exp.Query):
        raise InvalidArgument(
            f"only queries (SELECT ...) are served here; {tree.key.upper()} is refused: writes go "
            "through DoPut and the harness actions"
        )
    check_functions(tree)
    return tree


def bind_parameters(tree: exp.Query, params: Sequence[Any]) -> exp.Query:
    """Replace ``?`` placeholders, in order, with literals of ``params``."""
    holders = list(tree.find_all(exp.Placeholder))
    if len(holders) != len(params):
        raise InvalidArgument(f"the statement has {len(holders)} parameter(s), got {len(params)}")
    tree = tree.copy()
    for holder, value in zip(list(tree.find_all(exp.Placeholder)), params, strict=True):
        holder.replace(exp.convert(value))
    return tree


def _cte_names(tree: Any) -> set[str]:
    return {cte.alias_or_name for cte in tree.find_all(exp.CTE)}


def table_refs(tree: exp.Query) -> list[TableRef]:
    """The harness tables the statement reads; table functions are refused."""
    for node in tree.find_all(exp.Table):
        if not isinstance(node.this, exp.Identifier):  # read_csv(...), range(...), ...
            raise InvalidArgument("table functions are not allowed; read harness tables by name")
    for clause in tree.find_all(exp.From, exp.Join):
        if not isinstance(clause.this, exp.Table | exp.Subquery):
            raise InvalidArgument("table functions are not allowed; read harness tables by name")
    ctes = _cte_names(tree)
    refs = []
    for node in tree.find_all(exp.Table):
        if not node.name or (node.name in ctes and not node.db):
            continue
        ref = TableRef(node, harness_name(node), node.alias_or_name)
        _pin(ref, node.args.get("version"))
        refs.append(ref)
    if not refs:
        raise InvalidArgument("the statement reads no harness table")
    return refs


def _pin(ref: TableRef, version: exp.Expression | None) -> None:
    if version is None:
        return
    value = version.expression
    literal = value.this if isinstance(value, exp.Literal) else value.sql()
    if version.name.upper() == "VERSION":
        try:
            ref.version = int(literal)
        except ValueError as e:
            raise InvalidArgument(f"FOR VERSION AS OF needs an integer, got {literal!r}") from e
    else:
        ref.as_of = parse_timestamp(literal, "FOR TIMESTAMP AS OF")


def _owner(col: exp.Column, refs: Sequence[TableRef], schemas: Mapping[str, set[str]]) -> list[int]:
    """Indexes of the refs a column may belong to."""
    if col.table:
        return [i for i, r in enumerate(refs) if r.alias == col.table]
    return [i for i, r in enumerate(refs) if col.name in schemas[r.alias]]


def _needed_columns(tree: exp.Query, refs: list[TableRef], schemas: Mapping[str, set[str]]) -> None:
    for star in tree.find_all(exp.Star):
        if isinstance(star.parent, exp.Count):
            continue
        qualifier = star.parent.table if isinstance(star.parent, exp.Column) else ""
        for r in refs:
            if not qualifier or r.alias == qualifier:
                r.columns = None
    for col in tree.find_all(exp.Column):
        for i in _owner(col, refs, schemas):
            cols = refs[i].columns
            if cols is not None and col.name in schemas[refs[i].alias]:
                cols.add(col.name)


def _conjuncts(where: Any) -> list[Any]:
    if isinstance(where, exp.And):
        return _conjuncts(where.left) + _conjuncts(where.right)
    if isinstance(where, exp.Paren):
        return _conjuncts(where.this)
    return [where]


def _pushdown(tree: exp.Query, refs: list[TableRef], schemas: Mapping[str, set[str]]) -> None:
    if not isinstance(tree, exp.Select) or tree.args.get("where") is None:
        return
    joins = tree.args.get("joins") or []
    if any(j.side or j.kind in ("OUTER", "FULL") for j in joins):
        return
    source = tree.args.get("from_") or tree.args.get("from")  # the key differs by sqlglot version
    direct = {id(n) for n in [source, *joins] if n is not None}
    for conj in _conjuncts(tree.args["where"].this):
        if conj.find(exp.Subquery, exp.Select, exp.Placeholder):
            continue
        owners = {i for c in conj.find_all(exp.Column) for i in _owner(c, refs, schemas)}
        if len(owners) != 1:
            continue
        ref = refs[owners.pop()]
        if id(ref.node.parent) not in direct:
            continue  # a table inside a subquery or CTE: its WHERE is not this one
        bare = conj.copy()
        for c in bare.find_all(exp.Column):
            c.set("table", None)
        ref.filters.append(bare.sql(DIALECT))


def plan_refs(tree: exp.Query, refs: list[TableRef], schemas: Mapping[str, set[str]]) -> None:
    """Fill each ref's needed columns and pushable filters."""
    _needed_columns(tree, refs, schemas)
    _pushdown(tree, refs, schemas)


def read_request(ref: TableRef, schema_names: Sequence[str], filters: Sequence[str]) -> ReadRequest:
    """The harness read of one ref: its columns (one, at least, so row counts hold) and the
    conjuncts the harness accepted."""
    cols = None
    if ref.columns is not None:
        cols = tuple(n for n in schema_names if n in ref.columns) or tuple(schema_names[:1])
    return ReadRequest(
        table=ref.table,
        columns=cols,
        filter=" AND ".join(f"({f})" for f in filters) or None,
        version=ref.version,
        as_of=ref.as_of,
    )


def rewrite(tree: exp.Query, refs: Sequence[TableRef], relation_of: Sequence[int]) -> str:
    """The statement as DuckDB runs it: reference ``i`` reads view ``__harness_<relation_of[i]>``
    under its own alias (references of one table at one version share a view)."""
    copy = tree.copy()
    for i, node in _rewrite_targets(copy, refs):
        view = exp.to_table(f"__harness_{relation_of[i]}")
        node.replace(exp.alias_(view, refs[i].alias, table=True))
    return copy.sql(DIALECT)


def reads_more_than_once(tree: exp.Query) -> bool:
    """True when DuckDB may scan one table reference more than once: CTEs (inlined per use,
    recursive ones per iteration). A stream can be read once only."""
    return tree.find(exp.CTE) is not None


def check_duckdb_functions(con: Any, sql: str) -> None:
    """The ``denied`` check on DuckDB's own parse of ``sql``: whatever syntax calls a function
    (``'x'.current_setting()``, ``main.f()``, a quoted name), DuckDB names it here."""
    parsed = json.loads(con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    if parsed.get("error"):
        raise InvalidArgument(f"the query failed: {parsed.get('error_message')}")
    for name in _function_names(parsed):
        if denied(name):
            raise _refuse(name)


def _function_names(tree: Any) -> Iterator[str]:
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("function_name"), str):
                yield node["function_name"]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _rewrite_targets(tree: exp.Query, refs: Sequence[TableRef]) -> list[tuple[int, exp.Table]]:
    """The table nodes of a copy of the statement, matched to its refs by position."""
    ctes = _cte_names(tree)
    nodes = [n for n in tree.find_all(exp.Table) if n.name and not (n.name in ctes and not n.db)]
    if len(nodes) != len(refs):
        raise InvalidArgument("could not map the statement's tables")
    return list(enumerate(nodes))
