"""The Flight SQL surface of the gateway, on the same port and auth as the native protocol.

Flight SQL commands are ``google.protobuf.Any`` messages of package
``arrow.flight.protocol.sql`` in CMD descriptors, tickets and action bodies; the native
protocol's JSON descriptors and ``h1.`` tickets never parse as one, so both share the server.
Served: ``CommandStatementQuery`` (+ ``TicketStatementQuery``), prepared statements with
parameters (``CreatePreparedStatement``/``ClosePreparedStatement`` actions, parameters bound by
DoPut, ``CommandPreparedStatementQuery``), ``CommandGetSqlInfo``, ``CommandGetCatalogs``,
``CommandGetDbSchemas``, ``CommandGetTables``, ``CommandGetTableTypes`` and
``CommandGetPrimaryKeys``; statements are cancelled by ``CancelFlightInfo`` and ``CancelQuery``
(``cancels``). Everything else is UNIMPLEMENTED; updates are refused (read-only). No
transactions: a message naming one (``transaction_id``) is UNIMPLEMENTED, like BeginTransaction.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from flight_gateway import __version__
from flight_gateway.core import tracing
from flight_gateway.core.auth import Principal
from flight_gateway.core.limits import SqlLimits
from flight_gateway.core.read.shape import column_specs
from flight_gateway.core.secrets import scrub
from flight_gateway.core.services import Core
from flight_gateway.core.write.ingest import read_upload
from flight_gateway.faces.flightsql import (
    cancels,
    early,
    engine,
    metadata,
    plans,
    query,
    relations,
)
from flight_gateway.faces.flightsql.handles import HandleSealer
from flight_gateway.faces.flightsql.workers import Execution, NoResult, Plan, Worker, WorkerPool
from flight_gateway.protocol import ReadRequest
from flight_gateway.protocol.errors import Busy, InvalidArgument
from flight_gateway.protocol.flightsql import is_statement, pack, pb, unpack

log = logging.getLogger(__name__)
#: A pinned version's hot sources (PostgreSQL, Kafka, streams) are made Parquet slices when
#: this many statements read a planned table: a slice holds the whole source at its pinned
#: state, so it serves every later statement at that version whatever columns it reads.
#: Measured (TPC-H SF 1, a quarter of lineitem and half of orders and supplier in versioned
#: PostgreSQL, ``bench_tpch_sql``): slicing on a table's second read made the first run of the
#: 22 queries 69 s (every new column set read PostgreSQL again, then sliced it) and a repeated
#: run 18.7 s; slicing on the first read, 22.3 s and 9.9 s (DuckDB: 4.2 s).
SLICE_AFTER_USES = 1
#: How long a new statement's GetFlightInfo waits for the schema of the statement it started
#: early (``early``) before typing it on a worker of its own, as before. A statement's result
#: carries its schema; typing it apart bound it a second time over empty relations: ~10-20 ms
#: of a new statement's ~50 (the 99 TPC-DS queries at SF 0.01, first run at a version, 2.1 s of
#: 9.2). A statement still running after this types in parallel with it, so the wait bounds
#: what a GetFlightInfo adds, not the statement's time.
EARLY_SCHEMA_WAIT_S = 0.25
#: A pinned table version of at most this many files, all read in place or as slices, is
#: planned once for every filter its statements put on it: pruning so few files saves less
#: than planning the table again (its kinds' plans, its files' footers). Measured (the 99
#: TPC-DS queries at SF 0.01, first run at a version, ``bench_tpch_sql``): 73 relations
#: planned for 24 tables, one per filter, then 30; the run 4.14 s -> 3.96 s (best of 3 each).
SMALL_RELATION_FILES = 8
#: Tables of one statement planned at once when none was planned before at its version
#: (``FlightSqlService._planned_all``).
PLAN_THREADS = 4
#: Bound parameters are one row: more than this decoded is RESOURCE_EXHAUSTED.
MAX_PARAMETER_BYTES = 1 << 20
SQL_INFO: dict[int, str | bool | int] = {
    pb.FLIGHT_SQL_SERVER_NAME: "DataHarness Flight gateway",
    pb.FLIGHT_SQL_SERVER_VERSION: __version__,
    pb.FLIGHT_SQL_SERVER_ARROW_VERSION: pa.__version__,
    pb.FLIGHT_SQL_SERVER_READ_ONLY: True,
    pb.FLIGHT_SQL_SERVER_SQL: True,
    pb.FLIGHT_SQL_SERVER_SUBSTRAIT: False,
    pb.SQL_DDL_CATALOG: False,
    pb.SQL_DDL_SCHEMA: False,
    pb.SQL_DDL_TABLE: False,
    pb.SQL_IDENTIFIER_QUOTE_CHAR: '"',
}


def refuse_transaction(message: Any) -> None:
    """UNIMPLEMENTED for a message naming a transaction, as for BeginTransaction itself: the
    server runs none (SqlInfo advertises none), and running the statement outside the
    client's transaction would let it believe its reads and writes were isolated."""
    fields = message.DESCRIPTOR.fields_by_name
    if "transaction_id" in fields and message.transaction_id:
        raise NotImplementedError(
            f"Flight SQL transactions are not supported (BeginTransaction is unimplemented): "
            f"send {type(message).__name__} without a transaction_id; each statement reads "
            "the versions it pins"
        )


def early_key(handle: dict[str, Any]) -> tuple[Any, ...]:
    """A statement started early (``early``) as its DoGet finds it: its SQL, pins and caller
    (the sealed ticket of a prepared statement is made after it started)."""
    return (handle["sql"], tuple(handle["pins"]), tuple(handle.get("ids") or ()),
            tuple(handle.get("schemas") or ()), handle["who"])  # fmt: skip


def _narrowed_key(snap: Any, cols: Sequence[str], flt: str | None) -> tuple[Any, ...]:
    """A pinned table's relation narrowed to a statement's columns and filter (``plans``)."""
    return (snap.table_id, snap.version, tuple(cols), flt, "narrowed")


def _files_listed(rel: relations.TableRelation) -> int:
    """A planned table's weight in the relation cache: the files it lists, one per part."""
    return sum(1 + len(getattr(p.scan, "files", ()) or ()) for p in rel.parts) + 1


@dataclass
class Result:
    schema: pa.Schema
    table: pa.Table | None = None  # computed at planning (metadata), else at DoGet
    app_metadata: bytes = b""


#: The tables a statement names, each with its explicit pin: (table, version, as_of).
Named = tuple[tuple[str, int | None, float | None], ...]


@dataclass(frozen=True)
class Statement:
    sql: str  # the handle's SQL, as the gateway wrote it
    tree: Any
    refs: list[query.TableRef]
    relation_of: list[int]  # reference -> relation
    again: list[bool]  # relation -> may DuckDB scan it more than once


class FlightSqlService:
    """Flight SQL over the core, carried by the Flight face (``faces.flight.server.Carried``)."""

    #: The Flight SQL actions (every other action is the Flight face's).
    actions = frozenset({"CreatePreparedStatement", "ClosePreparedStatement"}) | cancels.ACTIONS

    def __init__(
        self,
        core: Core,
        key: bytes,
        ttl_s: float = 3600.0,
        limits: SqlLimits | None = None,
        workers: int = 4,
    ) -> None:
        self.core = core
        self.reads = core.reads
        self.limits = limits or SqlLimits()
        self.workers = WorkerPool(engine.worker_limits(self.limits), workers)
        self.catalog = core.catalog
        #: Handles expire like tickets (the gateway's ``ticket_ttl_s``).
        self.handles = HandleSealer(key, ttl_s)
        self.running = cancels.Running(ttl_s)
        self.types: plans.Lru[pa.Schema] = plans.Lru("types", 4096, 4096)
        self.rewritten: plans.Lru[tuple[str, bool]] = plans.Lru("rewritten", 4096, 4096)
        self.parsed: plans.Lru[tuple[str, Named]] = plans.Lru("parsed", 4096, 4096)
        #: A statement's parsed tree by its text as handles carry it, read-only: the handle's
        #: first execution (or typing) reads it rather than parse the text again. Nothing
        #: changes a tree after its parse (``query.rewrite`` renames in its text, or changes
        #: a copy of its own), so statements share it as they share ``prepared``'s.
        self.trees: plans.Lru[tuple[Any, list[query.TableRef]]] = plans.Lru("trees", 256, 256)
        self.prepared: plans.Lru[tuple[Any, list[query.TableRef]]] = plans.Lru(
            "prepared", 1024, 1024
        )
        self.relations: plans.Lru[relations.TableRelation] = plans.Lru(
            "relations", 1024, 500_000, weigh=_files_listed
        )
        self.results = plans.Results(self.limits.result_cache_mb << 20)
        self.early = early.EarlyStarts(self.limits.early_start_s)
        self._planner: ThreadPoolExecutor | None = None  # made on first use
        self._warm_once = threading.Lock()

    @staticmethod
    def claim(data: bytes) -> Any | None:
        """The Flight SQL message in a command or ticket (None: a native one)."""
        message = unpack(data)
        if message is not None:
            refuse_transaction(message)
        return message

    # ------------------------------------------------------------------ statements

    def _statement(self, sql: str, params: Sequence[Any], who: Principal) -> dict[str, Any]:
        """Parse, check permissions and pin: the handle's content."""
        return self._pinned(sql, params, who)[0]

    def _pinned(
        self, sql: str, params: Sequence[Any], who: Principal
    ) -> tuple[dict[str, Any], list[Any]]:
        """``_statement``'s handle, and the snapshots it pins."""
        text, refs = self._parse(sql, params)
        floating = {table for table, version, as_of in refs if version is None and as_of is None}
        # One cut for every table not pinned explicitly: the catalog's clock when several
        # tables float; one table's cut is simply its latest version (a clock query less).
        moment = self.catalog.now() if len(floating) > 1 else None
        for table, _, _ in refs:
            who.require("read", table)
        # A table named several times is pinned once; all heads in one catalog read.
        snaps = self.reads.snapshots([
            (table, version, moment if version is None and as_of is None else as_of, None)
            for table, version, as_of in refs
        ])  # fmt: skip
        return {"kind": "statement", "sql": text, "pins": [s.version for s in snaps],
                "ids": [s.table_id for s in snaps], "who": who.name,
                "schemas": [s.schema.schema_id for s in snaps]}, snaps  # fmt: skip

    def _parse(self, sql: str, params: Sequence[Any]) -> tuple[str, Named]:
        """The SQL a handle carries and the tables it names, each with its explicit pin
        (``plans``: a statement without parameters is parsed once)."""
        if not params:
            hit = self.parsed.peek(sql)
            if hit is not None:
                return hit
        with tracing.span("sql.parse"):
            tree = query.parse(sql)
        if params:
            tree = query.bind_parameters(tree, params)
        elif any(True for _ in tree.find_all(query.exp.Placeholder)):
            raise InvalidArgument("the statement has parameters: prepare it and bind them")
        return self._parsed(sql, tree, keep=not params)

    def _parsed(
        self, sql: str, tree: Any, keep: bool, refs: list[query.TableRef] | None = None
    ) -> tuple[str, Named]:
        """``_parse``'s answer from ``sql``'s tree (parameters bound), kept when ``keep``
        (``refs``: the tree's ``query.table_refs`` when the caller has them). A statement
        without parameters keeps its own text as its handle's SQL: parsing that text again
        gives the same tree, and generating it anew cost ~2 ms of a new statement's
        planning (of a TPC-DS query's ~12 ms). One with parameters bound carries their
        values: its tree is written out."""
        refs = query.table_refs(tree) if refs is None else refs
        named = tuple((r.table, r.version, r.as_of) for r in refs)
        out = (sql if keep else tree.sql(query.DIALECT), named)
        if keep:
            self.parsed.add(sql, out)
        self.trees.add(out[0], (tree, refs))
        return out

    def _prepare_reads(
        self, handle: dict[str, Any], who: Principal | None = None, snaps: list[Any] | None = None
    ) -> tuple[Any, list[query.TableRef], list[Any]]:
        """The handle's statement with what each reference needs (``plans``: shared read-only
        by the statements of the same handle content), and its pinned tables (``snaps``: the
        ones its pinning read just now); ``who`` must be allowed to read each, checked before
        the catalog is asked anything."""
        ids = handle.get("ids") or [None] * len(handle["pins"])
        key = None
        if handle.get("schemas") is not None:
            key = (handle["sql"], tuple(handle["pins"]), tuple(ids), tuple(handle["schemas"]))
            hit = self.prepared.peek(key)
            if hit is not None:
                tree, refs = hit
                if who is not None:
                    for ref in refs:
                        who.require("read", ref.table)
                if snaps is not None:
                    return tree, refs, snaps
                pins = [(r.table, r.version, None, i) for r, i in zip(refs, ids, strict=True)]
                return tree, refs, self.reads.snapshots(pins)
        parsed = self.trees.peek(handle["sql"])
        if parsed is not None:  # its references found by its parse: fresh copies to fill in
            tree, refs = parsed[0], [query.fresh(r) for r in parsed[1]]
        else:
            tree = query.parse(handle["sql"])
            refs = query.table_refs(tree)
        if who is not None:
            for ref in refs:
                who.require("read", ref.table)
        for ref, version in zip(refs, handle["pins"], strict=True):
            ref.version, ref.as_of = int(version), None
        if snaps is None:  # else pinned just now by the caller, in the same order
            snaps = self.reads.snapshots(
                [(r.table, r.version, None, i) for r, i in zip(refs, ids, strict=True)]
            )
        schemas = {
            r.alias: {f.name for f in s.schema.fields} for r, s in zip(refs, snaps, strict=True)
        }
        query.plan_refs(tree, refs, schemas)
        if key is not None:
            self.prepared.add(key, (tree, refs))
        return tree, refs, snaps

    def _relations(
        self,
        handle: dict[str, Any],
        plan: bool,
        who: Principal | None = None,
        reads: tuple[Any, list[query.TableRef], list[Any]] | None = None,
    ) -> tuple[Statement, list[relations.TableRelation]]:
        """One relation per table and version the statement reads (planned when ``plan``, else
        empty relations of the right columns), and which one each reference reads; ``who``
        must be allowed to read every table (``reads``: ``_prepare_reads`` done already)."""
        tree, refs, snaps = reads or self._prepare_reads(handle, who)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, snap in enumerate(snaps):
            groups.setdefault((snap.table_id, snap.version), []).append(i)
        relation_of = [0] * len(refs)
        wanted: list[tuple[Any, list[str], str | None]] = []  # (snap, columns, filter)
        again = []
        for n, members in enumerate(groups.values()):
            snap = snaps[members[0]]
            names = [f.name for f in snap.schema.fields]
            columns = [refs[i].columns for i in members]
            if any(c is None for c in columns):
                cols = names
            else:
                used = set().union(*[c for c in columns if c is not None])
                cols = [c for c in names if c in used] or names[:1]  # one, so row counts hold
            flt = relations.combined_filter(snap, [refs[i].filters for i in members])
            wanted.append((snap, cols, flt))
            again.append(len(members) > 1 or query.reads_more_than_once(tree))
            for i in members:
                relation_of[i] = n
        if plan:
            rels = self._planned_all(wanted)
        else:
            rels = [relations.empty_relation(snap, cols) for snap, cols, _ in wanted]
        return Statement(handle["sql"], tree, refs, relation_of, again), rels

    def _planned_all(
        self, wanted: list[tuple[Any, list[str], str | None]]
    ) -> list[relations.TableRelation]:
        """``_planned`` of each (snap, columns, filter); the tables not planned before at
        their versions are planned at once, each on a thread of its own (``PLAN_THREADS``):
        a table's kinds wait on their servers and libraries (a PostgreSQL read sliced, a
        DuckLake layout, an Iceberg manifest list) more than they hold the interpreter."""
        new = [
            i
            for i, (snap, cols, flt) in enumerate(wanted)
            if _narrowed_key(snap, cols, flt) not in self.relations
        ]
        if len(new) < 2:
            return [self._planned(*w) for w in wanted]
        if self._planner is None:
            self._planner = ThreadPoolExecutor(PLAN_THREADS, thread_name_prefix="sql-plan")
        futures = {
            i: self._planner.submit(
                contextvars.copy_context().run, functools.partial(self._planned, *wanted[i])
            )
            for i in new
        }
        done = [f.exception() for f in futures.values()]  # every one ended before any raises
        for error in done:
            if error is not None:
                raise error
        return [futures[i].result() if i in futures else self._planned(*w)
                for i, w in enumerate(wanted)]  # fmt: skip

    def _planned(self, snap: Any, cols: list[str], flt: str | None) -> relations.TableRelation:
        """``cols`` of ``snap`` planned, once per pinned version (``plans``): the table's
        relation over all its columns, planned (and its hot sources sliced) once per version
        and filter (once per version for a small table: ``_small``), narrowed to ``cols``
        (TPC-DS's 99 statements plan 286 column sets of 73 such relations, 30 with small
        tables planned once). A table with a source still read from its server or as a
        stream (not sliced) is planned for ``cols`` alone: they decide what that source reads."""
        key = _narrowed_key(snap, cols, flt)
        hit = self.relations.peek(key)
        if hit is not None:
            return hit
        whole = self._small(snap, flt) if flt is not None else None
        if whole is None:
            whole = self._relation(snap, None, flt)
            if whole.hot:
                return self._relation(snap, cols, flt)
            if flt is not None and not whole.pruned and whole.file_count <= SMALL_RELATION_FILES:
                whole = self._small(snap, None) or whole  # the filter pruned nothing
        out = relations.narrowed(whole, cols)
        self.relations.add(key, out)
        return out

    def _small(self, snap: Any, flt: str | None) -> relations.TableRelation | None:
        """``snap``'s relation over all its rows when it lists at most
        ``SMALL_RELATION_FILES`` files, all read in place or as slices, for a statement with
        filter ``flt``: planned here when ``flt`` is None (a filter that pruned nothing),
        else only when planned before and ``flt`` prunes none of the table's sources. A filter only prunes sources and files
        (the statement applies its own, DuckDB skips row groups by their statistics):
        pruning so few files saves less than planning the table again."""
        if flt is not None and (
            (snap.table_id, snap.version, None, None) not in self.relations
            or relations.prunes_sources(snap, flt)
        ):
            return None
        whole = self._relation(snap, None, None)
        if whole.hot or whole.file_count > SMALL_RELATION_FILES:
            return None
        return whole

    def _relation(
        self, snap: Any, cols: list[str] | None, flt: str | None
    ) -> relations.TableRelation:
        """``cols`` (None: all) of ``snap`` planned, its hot sources sliced on first use."""

        def plan() -> relations.TableRelation:
            return relations.plan_table(
                self.reads, snap, snap.schema.names if cols is None else cols, flt
            )

        key = (snap.table_id, snap.version, None if cols is None else tuple(cols), flt)
        rel = self.relations.get(key, plan)
        rel.uses += 1
        if rel.uses == SLICE_AFTER_USES and rel.hot:
            try:
                with tracing.span("sql.slice", table=snap.table):
                    rel = relations.sliced(rel, snap, self.core.layouts)
            except Exception as e:  # the slice store full, a source failing: read as before
                log.warning("flight sql: %s@%d read without slices: %s", snap.table,
                            snap.version, scrub(str(e)))  # fmt: skip
            else:
                self.relations.put(key, rel)
        return rel

    def _run(
        self, plan: Plan, op: str, who: Principal | None = None, worker: Worker | None = None
    ) -> Execution:
        dsns = plan.dsns
        scope = ""
        if who is not None:  # the grants too: a database locked for a caller is not another's
            scope = json.dumps([who.name, sorted({*who.read, *who.write, *who.admin})])

        def translate(kind: str, message: str) -> BaseException:
            secrets = engine.secrets_of(dsns)
            return engine.translate(kind, message, self.limits, secrets, plan.statement)

        return Execution(
            self.workers,
            plan,
            op,
            timeout_s=self.limits.timeout_s,
            batch_rows=engine.BATCH_ROWS,
            translate=translate,
            scope=scope,
            worker=worker,
        )

    def _sql(self, stmt: Statement) -> tuple[str, bool]:
        """The statement as its worker runs it, checked, and whether it is deterministic
        (``plans``: the same handle SQL over the same grouping of references is rewritten and
        checked once)."""

        def checked() -> tuple[str, bool]:
            sql = query.rewrite(stmt.tree, stmt.refs, stmt.relation_of)
            return sql, query.check_duckdb_functions(sql)

        return self.rewritten.get((stmt.sql, tuple(stmt.relation_of)), checked)

    def schema_of(self, handle: dict[str, Any], who: Principal, slots: bool = True) -> pa.Schema:
        """The result schema: the statement over empty relations of the pinned columns (nothing
        is planned or read), typed by DuckDB in a worker: binding evaluates constant
        expressions, so typing holds a statement's slots and bounds like running it. The same
        SQL over tables of the same schemas was typed before: that answer (``plans``).
        ``slots`` False: the statement, started early, holds its caller's slots already."""
        key = self._types_key(handle)
        if key is None:  # a handle sealed before handles carried schema ids
            return self._typed(handle, who, slots)
        return self.types.get(key, lambda: self._typed(handle, who, slots))

    @staticmethod
    def _types_key(handle: dict[str, Any]) -> tuple[Any, ...] | None:
        """What a statement's result type is a function of: its SQL and the table id and
        schema of each table it reads."""
        schemas = handle.get("schemas")
        if schemas is None:
            return None
        return (handle["sql"], tuple(handle.get("ids") or ()), tuple(schemas))

    def _typed(self, handle: dict[str, Any], who: Principal, slots: bool = True) -> pa.Schema:
        stmt, rels = self._relations(handle, plan=False)
        plan = engine.build(self._sql(stmt)[0], rels, stmt.again)
        if not slots:
            return self._run(plan, "schema").schema()
        self._take_slots(who)  # as running it: typing evaluates
        try:
            return self._run(plan, "schema").schema()
        finally:
            self.core.release_statement_slots(who.name)

    def _take_slots(self, who: Principal) -> None:
        """A statement's slots; when they are all held, statements started early that no
        DoGet took yet give theirs up, the oldest first (``early``: they never make a call
        fail)."""
        while True:
            try:
                self.core.take_statement_slots(who.name)
                return
            except Busy:
                if not self.early.abandon_oldest():
                    raise

    def execute(
        self, handle: dict[str, Any], who: Principal, key: bytes = b""
    ) -> pa.RecordBatchReader:
        """The statement's result, streamed as its worker produces it (the caller holds the
        statement's slots until the stream ends); cancellable by its sealed handle ``key``.
        A deterministic statement over the same pinned versions ran before: its kept result
        (``plans``: ``results``), after the same permission and pin checks."""
        reads = self._prepare_reads(handle, who)  # permissions and pins
        kept_as = self._result_key(handle)
        if kept_as is not None:
            kept = self.results.peek(kept_as)
            if kept is not None:
                return kept.to_reader()
        plan, same_rows = self._built(handle, who, reads)
        return self._streamed(key, self._run(plan, "run", who), kept_as if same_rows else None)

    def _built(
        self, handle: dict[str, Any], who: Principal, reads: Any = None
    ) -> tuple[Plan, bool]:
        """What a worker runs for the handle's statement, and whether it is deterministic."""
        with tracing.span("sql.plan"):
            stmt, rels = self._relations(handle, plan=True, who=who, reads=reads)
        relations.check_files(rels)
        sql, same_rows = self._sql(stmt)
        try:
            plan = engine.build(sql, rels, stmt.again)
        except Exception as e:  # the sources failed, not the caller's SQL
            raise engine.source_failure(e) from None
        if log.isEnabledFor(logging.INFO):  # the report costs more than a tiny statement's plan
            names = [r.table for r in rels]
            report = {
                (r.table if names.count(r.table) == 1 else f"{r.table}@{r.version}"): r.report()
                for r in rels
            }
            log.info("flight sql: %s", json.dumps(report))
        return plan, same_rows

    def _streamed(
        self, key: bytes, ex: Execution, kept_as: tuple[Any, ...] | None
    ) -> pa.RecordBatchReader:
        """``ex``'s result as its worker produces it, kept as ``kept_as`` when given."""
        stream = self.running.stream(key, ex)
        if kept_as is not None:
            stream = self.results.keeping(kept_as, stream)
        return tracing.traced_stream("sql.execute", stream)

    def _start_early(
        self, key: Any, handle: dict[str, Any], snaps: list[Any], who: Principal
    ) -> early.Started | None:
        """Start the statement of ``key`` for its DoGet (``early``) when a worker is idle and
        its caller's slots are free now; any failure is left for its DoGet to meet."""
        kept_as = self._result_key(handle)
        if kept_as is not None and kept_as in self.results:
            return None  # its DoGet is answered from the kept result
        worker = self.workers.take_idle()
        if worker is None:
            return None
        try:
            self.core.take_statement_slots(who.name)
        except Busy:
            self.workers.give_back(worker, healthy=True)
            return None
        try:
            started = self._started(key, handle, snaps, who, worker, kept_as)
        except Exception as e:
            log.debug("statement not started early: %s", e)
            started = None
        if started is None:
            self.core.release_statement_slots(who.name)
            return None
        self.early.add(started)
        return started

    def _started(
        self,
        key: Any,
        handle: dict[str, Any],
        snaps: list[Any],
        who: Principal,
        worker: Worker,
        kept_as: tuple[Any, ...] | None,
    ) -> early.Started | None:
        """The statement running on ``worker`` (given back here if it is not), or None for a
        statement that reads streams (their sources would be read for nothing if no DoGet
        came)."""
        try:
            plan, same_rows = self._built(handle, who, self._prepare_reads(handle, who, snaps))
        except BaseException:
            self.workers.give_back(worker, healthy=True)
            raise
        if plan.streams:
            self.workers.give_back(worker, healthy=True)
            return None
        ex = self._run(plan, "run", who, worker=worker)
        return early.Started(
            key,
            who.name,
            ex,
            release=lambda: self.core.release_statement_slots(who.name),
            kept_as=kept_as if same_rows else None,
        )

    def engine_plan(self, sql: str, who: Principal) -> Plan:
        """What a worker would run for ``sql`` now (its views over the pinned sources, then
        the rewritten statement), planned exactly as a statement is, without running it:
        benchmarks time DuckDB alone over the same files with it."""
        stmt, rels = self._relations(self._statement(sql, (), who), plan=True, who=who)
        return engine.build(self._sql(stmt)[0], rels, stmt.again)

    def _result_key(self, handle: dict[str, Any]) -> tuple[Any, ...] | None:
        """What a statement's rows are a function of: its SQL (parameters bound) and the table
        id, version and schema of each table it reads."""
        if handle.get("schemas") is None or not self.results.capacity:
            return None
        return (handle["sql"], tuple(handle["pins"]), tuple(handle.get("ids") or ()),
                tuple(handle["schemas"]))  # fmt: skip

    def close(self) -> None:
        self.early.abandon_all()
        self.workers.close()
        if self._planner is not None:
            self._planner.shutdown(wait=False, cancel_futures=True)

    def _warm(self) -> None:
        """On the first Flight SQL call: a statement worker started, and what the process's
        first statement would pay once for its parse and check made ahead (``query.warm``)."""
        if self._warm_once.acquire(blocking=False):  # never released: once per service
            threading.Thread(target=query.warm, daemon=True, name="sql-warm").start()
        self.workers.warm()

    # ------------------------------------------------------------------ Flight calls

    def get_flight_info(
        self, message: Any, descriptor: fl.FlightDescriptor, who: Principal
    ) -> fl.FlightInfo:
        self._warm()
        result, ticket = self._plan(message, who)
        endpoint = fl.FlightEndpoint(ticket, [])
        return fl.FlightInfo(
            result.schema, descriptor, [endpoint], -1, -1, app_metadata=result.app_metadata
        )

    def _plan(self, message: Any, who: Principal) -> tuple[Result, bytes]:
        if isinstance(message, pb.CommandStatementQuery):
            return self._statement_info(*self._pinned(message.query, (), who), who)
        if isinstance(message, pb.CommandPreparedStatementQuery):
            prepared = self._open(message.prepared_statement_handle, who, "prepared")
            return self._statement_info(
                *self._pinned(prepared["sql"], prepared.get("params") or (), who), who
            )
        table = self._metadata(message, who)
        return Result(table.schema, table), pack(message)

    def _statement_info(
        self, handle: dict[str, Any], snaps: list[Any], who: Principal
    ) -> tuple[Result, bytes]:
        sealed = self.handles.seal(handle)
        ticket = pack(pb.TicketStatementQuery(statement_handle=sealed))
        meta = json.dumps({"pins": handle["pins"]}).encode()
        return Result(self._schema_starting(handle, snaps, who), None, meta), ticket

    def _schema_starting(
        self, handle: dict[str, Any], snaps: list[Any], who: Principal
    ) -> pa.Schema:
        """``schema_of`` the handle's statement, then the statement started for its DoGet
        (``early``) unless it was already (by its CreatePreparedStatement)."""
        if not self.early.enabled:
            return self.schema_of(handle, who)
        key = early_key(handle)
        if self.early.holds(key, who.name):
            return self.schema_of(handle, who)
        typed_as = self._types_key(handle)
        known = self.types.peek(typed_as) if typed_as is not None else None  # a hit or a miss
        if typed_as is None or known is not None:
            schema = known if known is not None else self.schema_of(handle, who)
            self._start_early(key, handle, snaps, who)
            return schema
        # A new statement: started first, its schema is the one its result carries (no
        # second binding of it to type it); else it is typed as before, and typing reports a
        # statement that cannot be bound.
        started = self._start_early(key, handle, snaps, who)
        if started is None:
            return self.schema_of(handle, who)
        self.early.answering(started)  # not stopped for want of a DoGet before it is answered
        try:
            schema = self._early_schema(started, handle, who, typed_as)
        except BaseException:
            self.early.abandon(key)
            raise
        self.early.answered(started)
        return schema

    def _early_schema(
        self, started: early.Started, handle: dict[str, Any], who: Principal, typed_as: Any
    ) -> pa.Schema:
        """The schema of a new statement ``started`` early: its result's, else typed."""
        try:
            schema = started.execution.result_schema(EARLY_SCHEMA_WAIT_S)
        except NoResult:  # its DoGet, if any, runs it again and meets why
            self.early.abandon(started.key)
            return self.schema_of(handle, who)
        if schema is None:  # still running: typed beside it, on its slots while it has them
            return self.schema_of(handle, who, slots=not self.early.holds(started.key, who.name))
        self.types.add(typed_as, schema)
        return schema

    def _open(
        self, sealed: bytes, who: Principal, kind: str, keep_expiry: bool = False
    ) -> dict[str, Any]:
        """A handle of ``kind`` (``statement``: a planned statement's ticket; ``prepared``: a
        prepared statement) issued to ``who``."""
        handle = self.handles.open(sealed, keep_expiry=keep_expiry)
        if handle.get("kind") != kind:
            what = "a statement ticket's" if kind == "statement" else "a prepared statement's"
            raise InvalidArgument(f"this is not {what} handle")
        if handle.get("who") != who.name:
            raise InvalidArgument("this statement handle was issued to another principal")
        return handle

    def do_get(
        self, message: Any, who: Principal
    ) -> tuple[pa.RecordBatchReader, Callable[[], None] | None]:
        """A result and what to run when its stream ends: a statement holds its caller's stream
        slot and a statement slot until then."""
        if not is_statement(message):
            return self._metadata(message, who).to_reader(), None
        key = bytes(message.statement_handle)
        handle = self._open(key, who, "statement")
        self.running.check(key)
        started = self.early.take(early_key(handle), who.name)
        if started is not None:
            return self._take_over(started, handle, who, key), started.release
        self._take_slots(who)
        try:
            reader = self.execute(handle, who, key)
        except BaseException:
            self.core.release_statement_slots(who.name)
            raise
        return reader, lambda: self.core.release_statement_slots(who.name)

    def _take_over(
        self, started: early.Started, handle: dict[str, Any], who: Principal, key: bytes
    ) -> pa.RecordBatchReader:
        """The result of a statement started early (its plan is its FlightInfo's), cancellable
        by its ticket's handle ``key``, after the checks of any DoGet: its caller may still
        read its tables, and the versions it pins are still there (not dropped nor expired).
        They run while the statement does."""
        try:
            self._prepare_reads(handle, who)
        except BaseException:
            started.release()
            started.execution.abandon()
            raise
        try:
            return self._streamed(key, started.execution, started.kept_as)
        except BaseException:
            started.release()
            raise

    def get_schema(self, message: Any, who: Principal) -> pa.Schema:
        return self._plan(message, who)[0].schema

    def _metadata(self, m: Any, who: Principal) -> pa.Table:
        if isinstance(m, pb.CommandGetSqlInfo):
            return metadata.sql_info(SQL_INFO, list(m.info))
        if isinstance(m, pb.CommandGetCatalogs):
            return metadata.catalogs()
        if isinstance(m, pb.CommandGetDbSchemas):
            catalog = m.catalog if m.HasField("catalog") else None
            pattern = m.db_schema_filter_pattern if m.HasField("db_schema_filter_pattern") else None
            return metadata.db_schemas(catalog, pattern)
        if isinstance(m, pb.CommandGetTables):
            return self._tables(m, who)
        if isinstance(m, pb.CommandGetTableTypes):
            return metadata.table_types()
        if isinstance(m, pb.CommandGetPrimaryKeys):
            who.require("read", m.table)
            return metadata.primary_keys(m.table, self.reads.snapshot(m.table).primary_key)
        raise NotImplementedError(f"Flight SQL command {type(m).__name__} is not supported")

    def _tables(self, m: Any, who: Principal) -> pa.Table:
        catalog = m.catalog if m.HasField("catalog") else None
        schema_pattern = (
            m.db_schema_filter_pattern if m.HasField("db_schema_filter_pattern") else None
        )
        name_pattern = (
            m.table_name_filter_pattern if m.HasField("table_name_filter_pattern") else None
        )
        types = list(m.table_types)
        names: list[str] = []
        if metadata.in_scope(catalog, schema_pattern) and (not types or "TABLE" in types):
            names = [
                n
                for n in self.catalog.list_tables()
                if who.can("read", n) and metadata.sql_like(name_pattern, n)
            ]
        if not m.include_schema:
            return metadata.tables(names, None)
        schemas = [self.reads.schema_for(ReadRequest(table=n))[1] for n in names]
        return metadata.tables(names, schemas)

    # ------------------------------------------------------------------ actions and DoPut

    def do_action(self, action_type: str, body: bytes, who: Principal) -> list[bytes]:
        self._warm()
        if action_type == "CreatePreparedStatement":
            request = unpack(body)
            if not isinstance(request, pb.ActionCreatePreparedStatementRequest):
                raise InvalidArgument(
                    "CreatePreparedStatement needs an ActionCreatePreparedStatementRequest"
                )
            refuse_transaction(request)
            return [pack(self._prepared(request.query, who))]
        if action_type == "ClosePreparedStatement":
            return []  # handles hold no server state
        if action_type in cancels.ACTIONS:
            return [self._cancel(action_type, body, who)]
        raise NotImplementedError(f"Flight SQL action {action_type!r} is not supported")

    def _prepared(self, sql: str, who: Principal) -> pb.ActionCreatePreparedStatementResult:
        """A prepared statement's handle and result schema (``plans``: a statement without
        parameters prepared before is not parsed again; permissions are checked each time)."""
        cached = self.parsed.peek(("prepare", sql))
        tree = None
        if cached is None:
            tree = query.parse(sql)
            refs = query.table_refs(tree)
            tables = [ref.table for ref in refs]
            count = query.parameter_count(tree)
            if not count:
                self.parsed.add(("prepare", sql), ("", tuple((t, None, None) for t in tables)))
                self._parsed(sql, tree, keep=True, refs=refs)  # its own: not parsed again
        else:
            tables, count = [table for table, _, _ in cached[1]], 0
        for table in tables:
            who.require("read", table)
        handle = {"kind": "prepared", "sql": sql, "params": None, "who": who.name}
        result = pb.ActionCreatePreparedStatementResult(
            prepared_statement_handle=self.handles.seal(handle)
        )
        # The result's schema, typed now: JDBC takes a prepared statement without one for
        # an update. Parameters are typed as NULL (their types come with their values).
        if count:
            typed = self._statement(sql, [{"sql": "NULL"}] * count, who)
            schema = self.schema_of(typed, who)
        else:  # started now: ADBC's GetFlightInfo and DoGet of it follow at once
            schema = self._schema_starting(*self._pinned(sql, (), who), who)
        result.dataset_schema = schema.serialize().to_pybytes()
        if count:
            assert tree is not None
            result.parameter_schema = self._parameter_schema(tree).serialize().to_pybytes()
        return result

    def _cancel(self, action_type: str, body: bytes, who: Principal) -> bytes:
        """Cancel the statements of a FlightInfo issued to ``who``: NOT_CANCELLABLE when it
        names none (a native read, a metadata result)."""
        status = cancels.NOT_CANCELLABLE
        for key in cancels.statement_handles(action_type, body):
            handle = self._open(key, who, "statement", keep_expiry=True)
            status = self.running.cancel(key)
            self.early.abandon(early_key(handle))
        return cancels.result(action_type, status)

    def _parameter_schema(self, tree: Any) -> pa.Schema:
        """The parameters' types, for clients that bind by them (JDBC): each that of the column
        it is compared with, else a string. A client may bind any type: the values' own
        types are used when the statement runs."""
        types: dict[str, pa.DataType] = {}
        for ref in query.table_refs(tree):
            snap = self.reads.snapshot(ref.table)
            for c in column_specs(snap, snap.schema.names):
                types.setdefault(c.name, c.arrow_type)
        columns = query.placeholder_columns(tree)
        return pa.schema([
            pa.field(f"parameter_{i + 1}", types.get(c or "", pa.string()))
            for i, c in enumerate(columns)
        ])  # fmt: skip

    def do_put(self, message: Any, reader: fl.MetadataRecordBatchReader, who: Principal) -> bytes:
        if isinstance(message, pb.CommandPreparedStatementQuery):
            prepared = self._open(message.prepared_statement_handle, who, "prepared", True)
            params = read_upload(reader, MAX_PARAMETER_BYTES)
            if params.num_rows > 1:
                raise InvalidArgument("bind one row of parameters per execution")
            row = params.to_pylist()[0] if params.num_rows else {}
            # As SQL literals of their types: the handle is JSON, and a timestamp, decimal or
            # bytes value must come back as itself.
            prepared["params"] = [query.literal(v) for v in row.values()]
            sealed = self.handles.seal(prepared)
            return bytes(
                pb.DoPutPreparedStatementResult(
                    prepared_statement_handle=sealed
                ).SerializeToString()
            )
        if isinstance(
            message,
            pb.CommandStatementUpdate
            | pb.CommandPreparedStatementUpdate
            | pb.CommandStatementIngest
            | pb.CommandStatementSubstraitPlan,
        ):
            raise InvalidArgument(
                "this Flight SQL endpoint is read-only: write with DoPut on a harness descriptor "
                "and commit with the harness actions"
            )
        raise NotImplementedError(f"Flight SQL command {type(message).__name__} is not supported")
