"""What DuckDB runs for one Flight SQL statement, built in the gateway, run in a worker.

The gateway describes a statement to its worker process (``workers.py``, ``worker.py``) as
setup steps and the statement itself. The harness relations (``__harness_<n>``) are DuckDB's
own Parquet reader over the pinned files of file-based sources, a ``postgres_query`` on an
``ATTACH``ed server for PostgreSQL sources, the harness stream for the rest (fed to the worker
through a pipe): common table expressions of the statement, but views made by the setup for
relations that read a server (``with_relations``). The worker runs the setup, then switches
external access off (``allowed_paths``: exactly the pinned files; ``allowed_directories``: the
spill directory) and locks the configuration, so the caller's SQL cannot read files, attach
databases, load extensions or change a setting. Each statement gets a fresh DuckDB database
there with its memory limit, threads, UTC session time zone and a spill directory of its own
(``harness-sql-<worker pid>-<n>`` under ``limits.sql_temp_dir``: DuckDB creates it on the first
spill and removes it when the database closes; the gateway removes a killed worker's).

Building needs DuckDB too (Parquet footers, DuckDB's name for an Arrow type), but only on the
harness's own files and schemas: the gateway keeps one such database (``metadata()``), on which
no caller SQL ever runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import pyarrow as pa

from flight_gateway.core.limits import SqlLimits
from flight_gateway.faces.flightsql.plans import Lru
from flight_gateway.faces.flightsql.workers import Plan, WorkerLimits
from flight_gateway.protocol.errors import (
    HarnessError,
    InvalidArgument,
    ResourceExhausted,
    TimedOut,
    Unavailable,
)
from planners.kind import ParquetScan, PostgresScan

if TYPE_CHECKING:
    from flight_gateway.faces.flightsql.relations import Part, TableRelation

log = logging.getLogger(__name__)
#: Each column's names, current first (a file written before a rename has an older one).
Names = Sequence[tuple[str, ...]]

#: Rows per result batch (a few MB for typical rows: what Flight streams best).
BATCH_ROWS = 64 * 1024
#: A Postgres scan estimated below this many rows is copied into DuckDB before the statement
#: runs: DuckDB knows no row count for ``postgres_query`` and can order joins badly around it
#: (TPC-H Q5 with supplier in Postgres: 1.9 s -> 1.4 s at SF 0.5).
SMALL_SCAN_ROWS = 100_000


def worker_limits(limits: SqlLimits) -> WorkerLimits:
    """What a statement worker is started with: the hard bound (``SqlLimits.hard_limit_mb``),
    DuckDB's own limit, threads, where and how far its statements may spill (the directory
    made if missing: DuckDB makes only the last level, on a statement's first spill)."""
    root = os.path.abspath(limits.temp_dir or tempfile.gettempdir())
    os.makedirs(root, mode=0o700, exist_ok=True)
    return WorkerLimits(
        memory_limit_mb=limits.hard_limit_mb,
        duckdb_memory_mb=int(limits.memory_limit_mb),
        threads=int(limits.threads) or (os.cpu_count() or 1),
        spill_root=root,
        spill_limit_mb=int(limits.spill_limit_mb),
    )


def _quote(text: str) -> str:
    """A DuckDB string literal."""
    return "'" + text.replace("'", "''") + "'"


#: Top-level columns of Parquet files by (path, size, modification time): relations of one table
#: planned for other filters, and of other versions sharing its files, would each read the
#: footers of all their files again.
FOOTERS: Lru[list[tuple[str, int | None]]] = Lru("footers", 50_000, 50_000)


def _stamp(path: str) -> tuple[int, int] | None:
    """(size, modification time in ns) of a local file; None where it cannot be told (the
    footer is read then, as before)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_size, st.st_mtime_ns


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_META: Any = None
_META_LOCK = threading.Lock()


def metadata() -> Any:
    """A cursor on the gateway's own DuckDB database, for footers and type names only."""
    global _META
    import duckdb

    with _META_LOCK:
        if _META is None:
            _META = duckdb.connect(
                config={
                    "autoinstall_known_extensions": False,
                    "autoload_known_extensions": False,
                    "memory_limit": "256MB",
                    "threads": 1,
                }
            )
        return _META.cursor()


def postgres_servers(relations: Sequence[TableRelation]) -> tuple[str, ...]:
    """The PostgreSQL servers (DSNs) a statement's relations scan, in a stable order."""
    dsns = {p.scan.dsn for r in relations for p in r.parts if isinstance(p.scan, PostgresScan)}
    return tuple(sorted(dsns))


def duckdb_types(con: Any, schema: pa.Schema) -> list[str]:
    """DuckDB's type for each field of ``schema`` (as DuckDB maps the Arrow type). Asked once
    per Arrow type, whatever the columns around it: typing a statement builds its views over
    new empty relations each time, each statement's relations hold other columns of the same
    tables, and asking cost ~2 ms a relation."""
    # A field's whole description (its type, nested fields, metadata such as an extension
    # name), not its name.
    field_keys = [_type_key(f) for f in schema]
    keys = dict(zip(field_keys, schema, strict=True))
    with _TYPES_LOCK:
        known = {k: _TYPES[k] for k in keys if k in _TYPES}
    missing = [k for k in keys if k not in known]
    if missing:
        name = "__harness_types"
        probe = pa.schema([keys[k].with_name(f"c{i}") for i, k in enumerate(missing)])
        con.register(name, probe.empty_table())
        try:
            found = [row[1] for row in con.execute(f"DESCRIBE {name}").fetchall()]
        finally:
            con.unregister(name)
        known.update(zip(missing, found, strict=True))
        with _TYPES_LOCK:
            _TYPES.update(zip(missing, found, strict=True))
            while len(_TYPES) > 4096:
                _TYPES.popitem(last=False)
    return [known[k] for k in field_keys]


def _type_key(field: pa.Field) -> bytes:
    return pa.schema([field.with_name("")]).serialize().to_pybytes()


_TYPES: OrderedDict[bytes, str] = OrderedDict()
_TYPES_LOCK = threading.Lock()


class Builder:
    """Describes the ``__harness_<n>`` views of one statement as steps of ``plan``."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._meta: Any = None
        self._attached = {dsn: f"__pg_{i}" for i, dsn in enumerate(plan.dsns)}
        self._streams = 0
        #: (name, query) of each relation read from files or streams, in order: common
        #: table expressions of the statement (``with_relations``).
        self.relations: list[tuple[str, str]] = []

    @property
    def meta(self) -> Any:
        """A cursor on the metadata database, opened when first needed: a relation planned
        before has its types and footers already (a tiny statement needs neither)."""
        if self._meta is None:
            self._meta = metadata()
        return self._meta

    def close(self) -> None:
        if self._meta is not None:
            self._meta.close()

    def view(self, index: int, rel: TableRelation, materialize: bool) -> None:
        if rel.duck_types is None:  # a relation planned once serves many statements
            rel.duck_types = duckdb_types(self.meta, rel.schema)
        types = rel.duck_types
        names = [c.names for c in rel.columns]
        selects = []
        for part in rel.parts:
            selects.extend(self._part(part, names, types, materialize))
        if not selects:
            cols = ", ".join(
                f"CAST(NULL AS {t}) AS {_ident(f.name)}"
                for f, t in zip(rel.schema, types, strict=True)
            )
            selects = [f"SELECT {cols} WHERE false"]
        body = " UNION ALL ".join(f"({s})" for s in selects)
        if any(isinstance(p.scan, PostgresScan) for p in rel.parts):
            # Made before the statement: binding asks the server, and a failure there is the
            # source's (UNAVAILABLE), not the caller's SQL (``worker.SetupFailed``).
            self.plan.steps.append({"sql": f"CREATE TEMP VIEW __harness_{index} AS {body}"})
        else:
            self.relations.append((f"__harness_{index}", body))

    def _part(self, part: Part, names: Names, types: list[str], materialize: bool) -> list[str]:
        if isinstance(part.scan, ParquetScan):
            return self._parquet(part, part.scan, names, types)
        if isinstance(part.scan, PostgresScan):
            return [self._postgres(part, part.scan, names, types)]
        return [self._stream(part, names, materialize)]

    # ------------------------------------------------------------------ Parquet

    def _footers(self, files: Sequence[str]) -> dict[str, list[tuple[str, int | None]]]:
        """Top-level (name, field id) of each file, from the Parquet footers: each file's
        read once while it is unchanged (``FOOTERS``)."""
        out: dict[str, list[tuple[str, int | None]]] = {}
        stamps = {f: _stamp(f) for f in files}
        for f, stamp in stamps.items():
            hit = FOOTERS.peek((f, stamp)) if stamp is not None else None
            if hit is not None:
                out[f] = hit
        missing = [f for f in files if f not in out]
        if not missing:
            return out
        rows = self.meta.execute(
            "SELECT file_name, name, field_id, num_children FROM parquet_schema(?)", [missing]
        ).fetchall()
        by_file: dict[str, list[tuple[str, int | None, int]]] = {}
        for file, name, fid, children in rows:
            by_file.setdefault(file, []).append((name, fid, children or 0))
        for file, elems in by_file.items():
            top, i = [], 1
            for _ in range(elems[0][2]):  # the root's children, skipping nested elements
                top.append((elems[i][0], elems[i][1]))
                i = _skip(elems, i)
            out[file] = top
            stamp = stamps.get(file)
            if stamp is not None:
                FOOTERS.add((file, stamp), top)
        return out

    def _parquet(self, part: Part, scan: ParquetScan, names: Names, types: list[str]) -> list[str]:
        files = list(scan.files)
        if not files:
            return []  # the tasks hold no file: no rows from this source
        self.plan.files.extend(files)
        if part.footers is None:
            part.footers = self._footers(files)
        footers = part.footers
        groups: dict[tuple[str | None, ...], list[str]] = {}
        for f in files:
            groups.setdefault(_physical(names, scan.field_ids, footers.get(f, [])), []).append(f)
        out = []
        for physical, group in groups.items():
            cols = [
                _column(n[0], t, p, part.source)
                for n, t, p in zip(names, types, physical, strict=True)
            ]
            listed = ", ".join(_quote(f) for f in group)
            # By name only across several files: DuckDB then reads every file's schema
            # before the scan (one file: its schema is the scan's), ~1 ms of a TPC-DS SF 0.01
            # statement's ~12 whose relations are single files.
            by_name = ", union_by_name=true" if len(group) > 1 else ""
            out.append(f"SELECT {', '.join(cols)} FROM read_parquet([{listed}]{by_name})")
        return out

    # ------------------------------------------------------------------ PostgreSQL

    def _postgres(self, part: Part, scan: PostgresScan, names: Names, types: list[str]) -> str:
        alias = self._attached[scan.dsn]  # the worker attaches every server of plan.dsns
        cols = [
            _column(n[0], t, scan.columns.get(n[0]), part.source)
            for n, t in zip(names, types, strict=True)
        ]
        select = (
            f"SELECT {', '.join(cols)} FROM postgres_query({_quote(alias)}, {_quote(scan.query)})"
        )
        if scan.estimated_rows is None or scan.estimated_rows >= SMALL_SCAN_ROWS:
            return select
        name = f"__small_{self._streams}"
        self._streams += 1
        self.plan.steps.append({"sql": f"CREATE TEMP TABLE {name} AS {select}"})
        return f"SELECT * FROM {name}"

    # ------------------------------------------------------------------ streams

    def _stream(self, part: Part, names: Names, materialize: bool) -> str:
        assert part.open is not None
        name = f"__stream_{self._streams}"
        self._streams += 1
        self.plan.steps.append(
            {"stream": name, "fd": len(self.plan.streams), "materialize": materialize}
        )
        self.plan.streams.append(part.open)
        cols = ", ".join(_ident(n[0]) for n in names)
        return f"SELECT {cols} FROM {name}_rows" if materialize else f"SELECT {cols} FROM {name}"


def _skip(elems: list[tuple[str, int | None, int]], i: int) -> int:
    """Index after element ``i`` and its nested children."""
    children = elems[i][2]
    i += 1
    for _ in range(children):
        i = _skip(elems, i)
    return i


def _physical(
    names: Names, field_ids: Mapping[str, int], top: list[tuple[str, int | None]]
) -> tuple[str | None, ...]:
    """Which column of a file holds each harness column (as a direct task maps them): the one
    with its field id, else the first of its names the file has; None when none does."""
    by_id = {fid: n for n, fid in top if fid is not None}
    present = {n for n, _ in top}
    out: list[str | None] = []
    for column in names:
        fid = field_ids.get(column[0])
        if fid is not None and fid in by_id:
            out.append(by_id[fid])
        else:
            out.append(next((n for n in column if n in present), None))
    return tuple(out)


def _column(name: str, duck_type: str, physical: str | None, source: str) -> str:
    value = (
        f"CAST(NULL AS {duck_type})"
        if physical is None
        else (f"CAST({_ident(physical)} AS {duck_type})")
    )
    if name == "_source":  # the source's name where the data has none (planners.execute)
        value = f"COALESCE({value}, CAST({_quote(source)} AS {duck_type}))"
    return f"{value} AS {_ident(name)}"


def build(
    sql: str, relations: Sequence[TableRelation], read_more_than_once: Sequence[bool]
) -> Plan:
    """What the worker runs for ``sql`` over the statement's relations."""
    plan = Plan(sql, dsns=postgres_servers(relations), statement=sql)
    builder = Builder(plan)
    try:
        for i, rel in enumerate(relations):
            builder.view(i, rel, read_more_than_once[i])
    finally:
        builder.close()
    with_relations(plan, builder.relations)
    return plan


# What may come before a statement's first keyword: whitespace and comments. A nested block
# comment ends this early; the statement then starts with neither head and gets views.
_LEAD = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.S)
_HEAD = re.compile(r"(?:(WITH)\b|SELECT\b|\()", re.I)
_RECURSIVE = re.compile(r"RECURSIVE\b", re.I)


def _cte_insert(sql: str) -> tuple[int, bool] | None:
    """Where the relations' common table expressions go in ``sql`` and whether the statement
    has a ``WITH`` of its own there (then they are followed by a comma), or None when it
    starts with neither ``WITH``, ``SELECT`` nor a parenthesis. Any case, after any
    whitespace and comments: the statement is the caller's own text (``query.rewrite``), and
    one after a comment was given views (every footer read twice)."""
    at = _LEAD.match(sql).end()  # type: ignore[union-attr]  # matches the empty string
    head = _HEAD.match(sql, at)
    if head is None:
        return None
    if head.group(1) is None:
        return at, False
    after = _LEAD.match(sql, head.end()).end()  # type: ignore[union-attr]
    recursive = _RECURSIVE.match(sql, after)
    return (recursive.end() if recursive else head.end()), True


def with_relations(plan: Plan, relations: Sequence[tuple[str, str]]) -> None:
    """The relations as common table expressions of the statement, inlined where they are
    read (``NOT MATERIALIZED``, as a view is); as views made before it runs for a statement
    that cannot take a ``WITH`` in front (``_cte_insert``).

    Not views: ``CREATE VIEW`` binds its query, so DuckDB opened every file and read its
    footer once for the view and again for the statement. Over the plans of the 99 TPC-DS
    statements at SF 0.01 (five views each), each in a fresh database, making the views took
    0.33 s (~0.7 ms each) and the statements ran 1.5x DuckDB on a Parquet copy, views
    included; as CTEs 1.25x."""
    if not relations:
        return
    ctes = ", ".join(f"{name} AS NOT MATERIALIZED ({query})" for name, query in relations)
    sql = plan.sql
    insert = _cte_insert(sql)
    if insert is None:
        for name, query in relations:
            plan.steps.append({"sql": f"CREATE TEMP VIEW {name} AS {query}"})
        return
    at, own = insert
    if own:  # the statement's own CTEs follow (they may read ours)
        plan.sql = f"{sql[:at]} {ctes}, {sql[at:]}"
    else:
        plan.sql = f"{sql[:at]}WITH {ctes} {sql[at:]}"


def secrets_of(dsns: Sequence[str]) -> list[str]:
    """What of a statement's PostgreSQL DSNs must not appear in an error: each DSN whole, and
    its password (URL or ``key=value`` form)."""
    out = []
    for dsn in dsns:
        out.append(dsn)
        if "://" in dsn:
            with contextlib.suppress(ValueError):
                password = urlsplit(dsn).password
                if password:
                    out += [password, quote(password, safe="")]
        out += [m.group(1).strip("'") for m in _PASSWORD.finditer(dsn)]
    return sorted({s for s in out if s}, key=len, reverse=True)


_PASSWORD = re.compile(r"(?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")


#: What only the relations' text holds, never a caller's statement (``query`` refuses
#: table functions and the reserved names).
_RELATION_TEXT = ("read_parquet(", "union_by_name=", "__stream_", "__small_", "postgres_query(")


def without_relations(message: str, statement: str | None = None) -> str:
    """``message`` without DuckDB's excerpt of the statement (``LINE 1: ...`` and a caret)
    when the excerpt shows the relations' text: the pinned files' paths and how the sources
    are read are the gateway's, not the caller's (the relations lead the statement as CTEs,
    so an error near the start of a short statement shows their end). With ``statement``
    (what the worker ran, before the relations were put in front) the excerpt is kept only
    when it is a piece of it: an excerpt can show a bare fragment of a file's path."""
    at = message.find("\nLINE ")
    if at < 0:
        return message
    if any(text in message[at:] for text in _RELATION_TEXT):
        return message[:at].rstrip()
    if statement is not None:
        shown = _EXCERPT.match(message, at + 1)
        piece = shown.group(1) if shown else ""
        piece = piece.removeprefix("...").removesuffix("...")
        if not piece or piece not in statement:
            return message[:at].rstrip()
    return message


_EXCERPT = re.compile(r"LINE \d+: ?([^\n]*)")


def translate(
    kind: str,
    message: str,
    limits: SqlLimits,
    secrets: Sequence[str] = (),
    statement: str | None = None,
) -> HarnessError:
    """A worker's failure (``worker._kind``) as the harness error a caller should see; the
    statement's connection secrets (PostgreSQL passwords) never appear in it, nor the text of
    its relations (``without_relations``; ``statement``: what ran, without them)."""
    for secret in secrets:
        if secret:
            message = message.replace(secret, "***")
    message = without_relations(message, statement)
    if kind == "interrupted":
        return TimedOut(
            f"the statement ran longer than limits.sql_timeout_s ({limits.timeout_s:g} s) and "
            "was stopped"
        )
    if kind == "memory":
        return ResourceExhausted(
            "the statement needed more than limits.sql_memory_limit_mb "
            f"({limits.memory_limit_mb} MB, spilling up to {limits.spill_limit_mb} MB): {message}"
        )
    if kind == "io":
        return Unavailable(f"the statement could not read a source: {message}")
    if kind == "source":
        return Unavailable(f"a source of the statement could not be read: {message}")
    if kind == "query":
        return InvalidArgument(f"the query failed: {message}")
    return Unavailable(f"the statement failed in its worker process: {message}")


def source_failure(e: BaseException) -> BaseException:
    """A failure while creating the statement's relations: a source could not be read."""
    if isinstance(e, HarnessError):
        return e
    return Unavailable(f"a source of the statement could not be read: {e}")
