"""Read-only SQL over harness tables: parsing, checking, pinning and rewriting a statement.

A statement is parsed with sqlglot. Every harness table it references is planned once per
statement at a pinned version (``flight_gateway.faces.flightsql.relations``: the caller's permissions,
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
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import sqlglot
from sqlglot import exp

from flight_gateway.protocol.errors import InvalidArgument, NotFound
from flight_gateway.protocol.messages import MAX_INT64, parse_timestamp

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


def fresh(ref: TableRef) -> TableRef:
    """``ref`` as ``table_refs`` found it: its columns and filters not filled in yet (a
    statement's planning fills its own copies; ``plan_refs``)."""
    return replace(ref, columns=set(), filters=[])


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
    except sqlglot.errors.SqlglotError as e:  # ParseError, TokenError (unterminated text)
        # sqlglot underlines the token with terminal escapes: plain text for every client.
        message = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
        raise InvalidArgument(f"syntax error: cannot parse the SQL statement: {message}") from e
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
    tree.meta[_TEXT] = sql
    return tree


def warm() -> None:
    """Made ahead, off a statement's path: what a process's first parse and check pay once
    (sqlglot's DuckDB dialect set up, the gateway's metadata database made, DuckDB's functions
    listed: ~30-40 ms of the TPC-DS first run's first statement). Failures are only logged."""
    try:
        # Not ``parse``: that is a statement's (tests count them).
        sqlglot.parse_one("SELECT 1 AS x FROM t WHERE x = 1", read=DIALECT)
        check_duckdb_functions("SELECT 1 AS x")
    except Exception as e:  # the first statement pays it then, and reports what fails
        log.warning("flight sql: warming the parser failed: %s", e)


def parameter_count(tree: exp.Query) -> int:
    """The statement's ``?`` placeholders."""
    return sum(1 for _ in tree.find_all(exp.Placeholder))


def placeholder_columns(tree: exp.Query) -> list[str | None]:
    """For each ``?`` in order, the column it is compared with (``c = ?``, ``? < c``,
    ``c BETWEEN ? AND ?``, ``c IN (?, ?)``), or None: what its type is taken from."""
    out: list[str | None] = []
    for holder in tree.find_all(exp.Placeholder):
        parent = holder.parent
        while isinstance(parent, exp.Paren | exp.Tuple):
            parent = parent.parent
        column = parent.this if isinstance(parent, exp.Binary | exp.Between | exp.In) else None
        if isinstance(parent, exp.Binary) and not isinstance(column, exp.Column):
            column = parent.expression
        out.append(column.name if isinstance(column, exp.Column) else None)
    return out


def bind_parameters(tree: exp.Query, params: Sequence[Any]) -> exp.Query:
    """Replace ``?`` placeholders, in order, with literals of ``params``."""
    holders = list(tree.find_all(exp.Placeholder))
    if len(holders) != len(params):
        raise InvalidArgument(f"the statement has {len(holders)} parameter(s), got {len(params)}")
    tree = tree.copy()
    tree.meta.pop(_TEXT, None)  # its text no longer: the values are in the tree alone
    for holder, value in zip(list(tree.find_all(exp.Placeholder)), params, strict=True):
        if isinstance(value, dict) and set(value) == {"sql"}:  # from ``literal``
            holder.replace(sqlglot.parse_one(str(value["sql"]), read=DIALECT))
        else:
            holder.replace(exp.convert(value))
    return tree


def literal(value: Any) -> dict[str, str]:
    """A bound parameter as the SQL literal of its type (kept in sealed handles as JSON).
    A float that is infinite or NaN is a typed literal: sqlglot writes ``inf`` (a column
    name to DuckDB) and NaN as NULL."""
    if isinstance(value, float) and not math.isfinite(value):
        return {"sql": f"'{value!r}'::DOUBLE"}  # 'inf', '-inf', 'nan': DuckDB reads all three
    if _non_finite_inside(value):
        raise InvalidArgument("cannot bind an infinite or NaN float inside a list or struct")
    try:
        return {"sql": exp.convert(value).sql(DIALECT)}
    except ValueError as e:
        raise InvalidArgument(f"cannot bind a parameter of type {type(value).__name__}") from e


def _non_finite_inside(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite_inside(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_non_finite_inside(v) for v in value)
    return False


def _cte_names(tree: Any) -> set[str]:
    return {cte.alias_or_name for cte in tree.find_all(exp.CTE)}


def _with_of(node: Any) -> Any:
    return node.args.get("with_") or node.args.get("with")  # the key differs by sqlglot version


def _visible_ctes(node: exp.Table) -> Iterator[str]:
    """Names of the CTEs in scope at ``node`` (SQL scoping: a query's CTEs are visible in its
    body and in later CTEs of the same WITH, a CTE in itself only under RECURSIVE)."""
    below: Any = None  # the child of ``child`` on the way up from ``node``
    child: Any = node
    parent: Any = node.parent
    while parent is not None:
        with_ = _with_of(parent) if isinstance(parent, exp.Query) else None
        if with_ is not None:
            ctes = list(with_.expressions)
            if child is with_:  # inside the WITH: ``below`` is the CTE that holds the node
                inside = next(i for i, c in enumerate(ctes) if c is below)
                upto = inside + 1 if with_.args.get("recursive") else inside
                yield from (c.alias_or_name for c in ctes[:upto])
            else:
                yield from (c.alias_or_name for c in ctes)
        below, child, parent = child, parent, parent.parent


def is_cte_reference(node: exp.Table) -> bool:
    """True when ``node`` names a CTE visible where it stands (DuckDB compares names without
    case), False for a harness table."""
    if node.db or node.catalog:
        return False
    name = node.name.lower()
    return any(c.lower() == name for c in _visible_ctes(node))


#: Names DuckDB resolves to its own catalog (settings, databases, attached servers, internal
#: relations): no CTE may take one, so nothing the rewrite leaves alone can reach them.
_SYSTEM_NAMES = ("information_schema", "sqlite_master", "sqlite_schema", "sqlite_temp_master")


def _check_cte_names(tree: Any) -> None:
    for name in _cte_names(tree):
        lowered = name.lower()
        if denied(lowered) or lowered.startswith(("__", "sqlite_")) or lowered in _SYSTEM_NAMES:
            raise InvalidArgument(f"{name!r} is reserved: name the CTE differently")


def table_refs(tree: exp.Query) -> list[TableRef]:
    """The harness tables the statement reads; table functions are refused."""
    for node in tree.find_all(exp.Table):
        if not isinstance(node.this, exp.Identifier):  # read_csv(...), range(...), ...
            raise InvalidArgument("table functions are not allowed; read harness tables by name")
    for clause in tree.find_all(exp.From, exp.Join):
        if not isinstance(clause.this, exp.Table | exp.Subquery):
            raise InvalidArgument("table functions are not allowed; read harness tables by name")
    _check_cte_names(tree)
    refs = []
    for node in tree.find_all(exp.Table):
        if not node.name or is_cte_reference(node):
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
        if not 0 <= ref.version <= MAX_INT64:
            raise InvalidArgument(
                f"FOR VERSION AS OF needs a version from 0 to 2**63 - 1, got {literal}"
            )
    else:
        ref.as_of = parse_timestamp(literal, "FOR TIMESTAMP AS OF")


class _Names:
    """A reference's column names, matched as DuckDB matches them: exactly, else without case
    (the first in sorted order of those equal without case)."""

    def __init__(self, names: set[str]) -> None:
        self.exact = names
        self.lowered: dict[str, str] = {}
        for n in sorted(names):
            self.lowered.setdefault(n.lower(), n)

    def actual(self, name: str) -> str | None:
        """The column ``name`` refers to, or None."""
        return name if name in self.exact else self.lowered.get(name.lower())


def _owner(col: exp.Column, refs: Sequence[TableRef], names: Mapping[str, _Names]) -> list[int]:
    """Indexes of the refs a column may belong to."""
    if col.table:
        qualifier = col.table.lower()
        return [i for i, r in enumerate(refs) if r.alias.lower() == qualifier]
    return [i for i, r in enumerate(refs) if names[r.alias].actual(col.name) is not None]


def _reads_whole_rows(
    nodes: Mapping[type, list[Any]], refs: list[TableRef], names: Mapping[str, _Names]
) -> None:
    """References whose columns cannot be listed from the SQL read all of them: ``*``,
    ``COLUMNS(...)``, ``JOIN ... USING``, a table alias used as a value (its whole row)."""
    everything = bool(nodes[exp.Columns]) or any(j.args.get("using") for j in nodes[exp.Join])
    for star in nodes[exp.Star]:
        if isinstance(star.parent, exp.Count):
            continue
        qualifier = star.parent.table.lower() if isinstance(star.parent, exp.Column) else ""
        for r in refs:
            if not qualifier or r.alias.lower() == qualifier:
                r.columns = None
    for col in nodes[exp.Column]:
        if col.table or any(n.actual(col.name) for n in names.values()):
            continue
        for r in refs:
            if r.alias.lower() == col.name.lower():
                r.columns = None
    if everything:
        for r in refs:
            r.columns = None


def _needed_columns(tree: exp.Query, refs: list[TableRef], names: Mapping[str, _Names]) -> None:
    # One walk of the tree for every kind of node looked at (a walk per kind, and per
    # column of each reference, was most of a new TPC-DS statement's planning).
    wanted = (exp.Column, exp.Star, exp.Columns, exp.Join)
    nodes: dict[type, list[Any]] = {kind: [] for kind in wanted}
    for node in tree.walk():
        for kind in wanted:
            if isinstance(node, kind):
                nodes[kind].append(node)
    _reads_whole_rows(nodes, refs, names)
    for col in nodes[exp.Column]:
        for i in _owner(col, refs, names):
            cols = refs[i].columns
            actual = names[refs[i].alias].actual(col.name)
            if cols is not None and actual is not None:
                cols.add(actual)


def _conjuncts(where: Any) -> list[Any]:
    if isinstance(where, exp.And):
        return _conjuncts(where.left) + _conjuncts(where.right)
    if isinstance(where, exp.Paren):
        return _conjuncts(where.this)
    return [where]


def _pushdown(tree: exp.Query, refs: list[TableRef], names: Mapping[str, _Names]) -> None:
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
        owners = {i for c in conj.find_all(exp.Column) for i in _owner(c, refs, names)}
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
    names = {alias: _Names(columns) for alias, columns in schemas.items()}
    _needed_columns(tree, refs, names)
    _pushdown(tree, refs, names)


def rewrite(tree: exp.Query, refs: Sequence[TableRef], relation_of: Sequence[int]) -> str:
    """The statement as DuckDB runs it: reference ``i`` reads view ``__harness_<relation_of[i]>``
    under its own alias (references of one table at one version share a view). The caller's
    own text with the names replaced (``_renamed``) when it can be, else a copy of the tree
    rewritten and written out."""
    renamed = _renamed(tree, refs, relation_of)
    if renamed is not None:
        return renamed
    copy = tree.copy()
    for i, node in _rewrite_targets(copy, refs):
        view = exp.to_table(f"__harness_{relation_of[i]}")
        node.replace(exp.alias_(view, refs[i].alias, table=True))
    return copy.sql(DIALECT, copy=False)  # a copy already: the generator may change it


#: Where ``parse`` keeps the text a tree was parsed from (``bind_parameters`` drops it).
_TEXT = "harness_text"
#: What a table reference may hold to be renamed in the text: its name and a plain alias.
_RENAMED_ARGS = frozenset({"this", "db", "catalog", "alias"})


def _renamed(tree: exp.Query, refs: Sequence[TableRef], relation_of: Sequence[int]) -> str | None:
    """The text ``tree`` was parsed from, each reference's name (``catalog.db.name``, by the
    positions sqlglot recorded) replaced by its view, an alias added where it had none; None
    when that cannot be done safely: the tree was not parsed from a text (parameters bound),
    a reference holds more than a name and a plain alias (``FOR VERSION AS OF``, column
    aliases, a sample) or a recorded position does not spell its name.
    Why: copying the tree and writing it out was a quarter of a new TPC-DS statement's time
    in the gateway (the copy's dictionaries, and collections of them). What DuckDB then runs
    is checked on its own parse as before (``check_duckdb_functions``: one statement, only
    the views and CTEs as tables, no denied function)."""
    text = tree.meta.get(_TEXT)
    if not isinstance(text, str):
        return None
    edits = []
    for i, node in _rewrite_targets(tree, refs):
        span = _name_span(text, node)
        if span is None:
            return None
        view = f"__harness_{relation_of[i]}"
        if node.args.get("alias") is None:  # its alias is its name, as it was spelled
            view += f" AS {text[span[2] : span[1]]}"
        edits.append((*span, view))
    edits.sort()
    out, at = [], 0
    for start, end, _, view in edits:
        if start < at:
            return None
        out += [text[at:start], view]
        at = end
    out.append(text[at:])
    return "".join(out).strip().rstrip(";").rstrip()


def _name_span(text: str, node: exp.Table) -> tuple[int, int, int] | None:
    """Where ``node``'s name stands in ``text`` (start, end exclusive, and where its last part
    starts), if it may be renamed."""
    if any(v is not None and k not in _RENAMED_ARGS for k, v in node.args.items()):
        return None
    alias = node.args.get("alias")
    if alias is not None and (
        alias.args.get("columns") or not isinstance(alias.this, exp.Identifier)
    ):
        return None
    parts = [node.args.get(k) for k in ("catalog", "db", "this") if node.args.get(k) is not None]
    spans = []
    for part in parts:
        if not isinstance(part, exp.Identifier):
            return None
        start, end = part.meta.get("start"), part.meta.get("end")
        if not isinstance(start, int) or not isinstance(end, int):
            return None
        spelled = f'"{part.name.replace(chr(34), chr(34) * 2)}"' if part.quoted else part.name
        if text[start : end + 1] != spelled:
            return None
        spans.append((start, end + 1))
    return spans[0][0], spans[-1][1], spans[-1][0]


def reads_more_than_once(tree: exp.Query) -> bool:
    """True when DuckDB may scan one table reference more than once: CTEs (inlined per use,
    recursive ones per iteration). A stream can be read once only."""
    return tree.find(exp.CTE) is not None


def check_duckdb_functions(sql: str) -> bool:
    """The ``denied`` check on DuckDB's own parse of ``sql``: whatever syntax calls a function
    (``'x'.current_setting()``, ``main.f()``, a quoted name), DuckDB names it here. Parsing
    only (the gateway's metadata database): nothing of the statement is bound or evaluated.
    Returns whether the statement is ``deterministic``."""
    from flight_gateway.faces.flightsql.engine import metadata

    con = metadata()
    try:
        # Without null and empty members (a quarter less JSON to write, parse and walk; the
        # walk reads a missing member as an empty one).
        parsed = json.loads(con.execute(_SERIALIZE, [sql]).fetchone()[0])
        consistent = _consistent_functions(con)
    finally:
        con.close()
    if parsed.get("error"):
        raise InvalidArgument(f"the query failed: {parsed.get('error_message')}")
    if len(parsed.get("statements") or []) != 1:
        raise InvalidArgument("give exactly one SQL statement")
    seen = _walk(parsed, consistent)
    for name in seen.functions:
        if denied(name):
            raise _refuse(name)
    _check_duckdb_tables(seen)
    return seen.deterministic


_SERIALIZE = "SELECT json_serialize_sql(?, skip_null := true, skip_empty := true)"
_CONSISTENT: frozenset[str] | None = None


def _consistent_functions(con: Any) -> frozenset[str]:
    """Names of DuckDB's functions whose every overload is ``CONSISTENT`` (the same arguments
    give the same answer, whenever called): not ``now()`` nor ``current_date``
    (``CONSISTENT_WITHIN_QUERY``), ``random()`` or ``nextval()`` (``VOLATILE``), nor macros
    (no stability recorded)."""
    global _CONSISTENT
    if _CONSISTENT is None:
        rows = con.execute(
            "SELECT function_name FROM duckdb_functions() GROUP BY function_name "
            "HAVING bool_and(coalesce(stability = 'CONSISTENT', false))"
        ).fetchall()
        _CONSISTENT = frozenset(name.lower() for (name,) in rows)
    return _CONSISTENT


def deterministic(parsed: Any, consistent: frozenset[str]) -> bool:
    """Whether a statement (DuckDB's parse) always gives the same rows over the same pinned
    tables: it calls only ``consistent`` functions, names no bare keyword such as
    ``current_date`` (DuckDB parses it as a column and binds it to a function) and samples
    nothing. Only such a statement's result may be reused (``plans``: ``results``)."""
    return _walk(parsed, consistent).deterministic


@dataclass
class _Seen:
    """What one walk over DuckDB's parse of a statement found (``check_duckdb_functions``):
    a statement's parse runs to ~18-60 kB of JSON, and three walks over it took ~0.5 ms."""

    functions: list[str] = field(default_factory=list)
    tables: list[Mapping[str, Any]] = field(default_factory=list)
    ctes: set[str] = field(default_factory=set)
    table_function: str | None = None
    deterministic: bool = True


def _walk(parsed: Any, consistent: frozenset[str]) -> _Seen:
    seen = _Seen()
    stack = [parsed]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            name = node.get("function_name")
            if isinstance(name, str):
                seen.functions.append(name)
                if name.lower() not in consistent:
                    seen.deterministic = False
            if node.get("sample"):
                seen.deterministic = False
            kind = node.get("type")
            if kind == "BASE_TABLE":
                seen.tables.append(node)
            elif kind == "TABLE_FUNCTION" and seen.table_function is None:
                seen.table_function = (node.get("function") or {}).get("function_name", "?")
            if node.get("class") == "COLUMN_REF":
                names = node.get("column_names") or []
                if len(names) == 1 and str(names[0]).lower() in _KEYWORD_FUNCTIONS:
                    seen.deterministic = False
            cte_map = node.get("cte_map")
            if cte_map:
                for entry in cte_map.get("map", []):
                    seen.ctes.add(str(entry.get("key", "")).lower())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return seen


#: Keywords DuckDB's parser leaves as column references and its binder calls as functions.
_KEYWORD_FUNCTIONS = frozenset({
    "current_date", "current_time", "current_timestamp", "localtime", "localtimestamp",
    "current_user", "current_role", "session_user", "user", "current_catalog",
    "current_schema", "current_database",
})  # fmt: skip


_INTERNAL = re.compile(r"^__harness_[0-9]+$")


def _check_duckdb_tables(seen: _Seen) -> None:
    """Every table DuckDB will look up is one of the statement's views or a CTE (no table
    function), and no CTE takes a reserved name: so no name can reach DuckDB's catalog, settings or attached
    servers, whatever scoping the first parse got wrong."""
    if seen.table_function is not None:  # the first parse refuses them too
        raise InvalidArgument(
            f"table function {seen.table_function}() is not allowed; read harness tables by name"
        )
    for name in seen.ctes:
        if denied(name) or name.startswith(("__", "sqlite_")) or name in _SYSTEM_NAMES:
            raise InvalidArgument(f"{name!r} is reserved: name the CTE differently")
    for t in seen.tables:
        name = str(t.get("table_name", ""))
        qualified = t.get("schema_name") or t.get("catalog_name")
        if qualified or not (_INTERNAL.fullmatch(name) or name.lower() in seen.ctes):
            raise InvalidArgument(f"table {name!r} is not a harness table of this statement")


def _rewrite_targets(tree: exp.Query, refs: Sequence[TableRef]) -> list[tuple[int, exp.Table]]:
    """The table nodes of a copy of the statement, matched to its refs by position."""
    nodes = [n for n in tree.find_all(exp.Table) if n.name and not is_cte_reference(n)]
    if len(nodes) != len(refs):
        raise InvalidArgument("could not map the statement's tables")
    return list(enumerate(nodes))
