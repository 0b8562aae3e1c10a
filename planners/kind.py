"""The source-kind interface: what every kind implements, and the capabilities it may add.

A source kind is one module (or one installed package, found through the ``dataharness.sources``
entry-point group; see ``planners.registry``) holding a subclass of ``SourceKind``:

- required: ``plan(request) -> list[ScanTask]`` decides the work for one pinned source state;
  ``read(request, task) -> pyarrow.RecordBatchReader`` turns one task into batches with the
  harness columns of the pinned version (``planners.common`` does the matching). A task is the
  wire-safe half of a read (it travels in signed tickets: small, JSON, no secrets); the request is
  rebuilt by the gateway from the catalog at the pinned version, with the source's config
  resolved, so secrets never leave the gateway.
- optional capabilities, each a small runtime-checkable protocol that the core asks about with
  ``isinstance(kind, Appendable)``, never by the kind's name:

  ============================  =========================================================
  ``Appendable``                DoPut (and Spark writes of small batches): idempotent by commit id
  ``AdoptsFiles``               engines write Parquet files, the kind adopts them in one commit
                                (Spark writes, compaction)
  ``EvolvesSchema``             additive DDL (new columns, widened types) before a schema commit
  ``Streams``                   the rows added between two states (streaming ``since`` reads)
  ``ReadsDirect``               clients read the task's files themselves (direct tasks)
  ``Maintains``                 housekeeping that respects pins (file cleanup, expiry, guards)
  ``HasCommands``               sub-commands of the ``harness-gateway`` CLI
  ============================  =========================================================

Invariants every kind keeps (docs/writing-a-source.md): reading a pinned state twice returns
the same rows; an append repeated with the same commit id writes nothing twice; tasks are small
and JSON-serialisable; nothing is visible before the harness commit that publishes the state.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Protocol, runtime_checkable

import pyarrow as pa

from flight_gateway.protocol.arrow_types import parse_type
from flight_gateway.protocol.errors import InvalidArgument
from planners.locations import ALLOW_ALL, Guard, Reach
from planners.predicates import Expr


@dataclass(frozen=True)
class ColumnSpec:
    """A harness column to produce: its stable id, current name, type and former names."""

    field_id: int
    name: str
    type: str
    aliases: tuple[str, ...] = ()

    @property
    def arrow_type(self) -> pa.DataType:
        return parse_type(self.type)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name this column has had, newest first."""
        return (self.name, *self.aliases)


@dataclass(frozen=True)
class SourceRef:
    """A source as pinned: config with ``${NAME}`` references already resolved (never put in
    tickets or error messages), partition values and the state of the pinned version."""

    name: str
    kind: str
    config: Mapping[str, Any]
    partition: Mapping[str, Any]
    state: Mapping[str, Any]


DEFAULT_MAX_TASKS = 10_000


@dataclass(frozen=True)
class ScanRequest:
    source: SourceRef
    columns: tuple[ColumnSpec, ...]  # columns to produce: projection plus filter columns
    predicate: Expr | None = None  # over harness column names
    limit: int | None = None
    #: Plan at most this many tasks; a kind that would make more raises INVALID_ARGUMENT before
    #: building them (the gateway's ``limits.max_tasks``).
    max_tasks: int = DEFAULT_MAX_TASKS
    #: Checks every file the kind opens or hands out that its config did not name (data, delete,
    #: manifest and log files listed in metadata). The gateway always sets it.
    guard: Guard = ALLOW_ALL

    def check_files(self, what: str, paths: Iterable[str]) -> None:
        """PERMISSION_DENIED unless every file is allowed (``what``: "data file", ...)."""
        from planners import locations

        self.guard.check(self.source.name, locations.files(what, paths))

    def check_real_files(self, what: str, reals: Iterable[str]) -> None:
        """``check_files`` of local paths already resolved (``locations.local_real``): a read
        resolves each file once, for this check and for the location it hands out."""
        self.guard.check(self.source.name, [Reach("path", what, r) for r in reals])

    def check_task_count(self, n: int) -> None:
        if n > self.max_tasks:
            raise InvalidArgument(
                f"source {self.source.name!r} would be read as {n} tasks, more than the "
                f"gateway's limit of {self.max_tasks}: narrow the read or make tasks larger"
            )


@dataclass(frozen=True)
class ScanTask:
    """One unit of reading: one Flight endpoint, one Spark partition. ``payload`` is JSON and
    carries no secrets (it is part of a signed ticket)."""

    source: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    #: True when ``read`` applies the request's whole predicate exactly (no residual needed).
    exact_filter: bool = False


@dataclass(frozen=True)
class Additive:
    """The additive part of a schema change, applied to sources with a schema of their own."""

    op: str  # "add" or "widen"
    names: tuple[str, ...]  # current name first, then former names (the physical one may be old)
    type: pa.DataType


@dataclass(frozen=True)
class AppendContext:
    """What an append needs besides the rows.

    ``intent`` and ``record_intent`` support kinds whose writes cannot be undone or found again
    by commit id alone (a Kafka produce): before writing, such a kind records where this commit
    starts with ``record_intent`` (the gateway commits it to ``external_state`` at once); a retry
    of the same commit id gets it back as ``intent`` and can look there for what was written.
    """

    source: SourceRef
    commit_id: str
    #: harness column name -> former names (a source written before a rename keeps old names)
    aliases: Mapping[str, tuple[str, ...]]
    intent: Mapping[str, Any] | None = None
    record_intent: Callable[[Mapping[str, Any]], None] = lambda _marker: None
    #: The harness table the append belongs to (names written data apart from other tables').
    table: str = ""
    #: Checks files the kind writes where metadata (not the config) chose the place.
    guard: Guard = ALLOW_ALL
    #: A key of the gateway's for this table incarnation and source: a kind that marks what it
    #: wrote so a retry can find it (Kafka headers) signs the marks with it, so that a writer
    #: without the key cannot pass its own data off as a commit's.
    tag_key: bytes = b""
    #: The rows were in the table already (a move from another source): a kind whose streaming
    #: reads list what each snapshot added marks the write so they skip it.
    relocation: bool = False
    #: What ``PreparesAppends.prepare_append`` wrote of these rows before the lease (or None).
    prepared: Any = None
    #: The harness catalog's tag (``Catalog.catalog_tag``, 12 hex digits): a kind that names
    #: files in storage another catalog may share (a files root) puts it in their names, so
    #: that neither catalog takes the other's file for its own or deletes it ("": none).
    catalog_tag: str = ""


# ---------------------------------------------------------------------------- typed configs

_REF = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$")


_HINTS: dict[type, dict[str, Any]] = {}


def _type_hints(cls: type) -> dict[str, Any]:
    """A config class's resolved annotations (resolving them per parse is slow, and commits parse
    the config of every source they update)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


@dataclass(frozen=True, kw_only=True)
class SourceConfig:
    """Base of typed source configs; the keys every kind accepts.

    A kind declares ``config_model = MyConfig`` (a ``@dataclass(frozen=True, kw_only=True)``
    deriving from this one) and gets ``parse_config``: unknown keys, missing required keys and
    wrong types are INVALID_ARGUMENT naming the key.
    """

    #: Rank of the source in the primary-key view (overrides the kind's ``dedupe_tier``).
    tier: int | None = None
    #: Group small files or ranges into tasks of about this many bytes.
    target_task_bytes: int | None = None
    #: Let clients that ask read this source's files themselves (direct tasks, DESIGN.md §10).
    direct: bool = False

    @classmethod
    def parse(cls, config: Mapping[str, Any], *, where: str, allow_refs: bool = False) -> Any:
        """Validate ``config``. With ``allow_refs`` a ``${NAME}`` string stands in for a value of
        any type (configs are checked before their references are resolved)."""
        if not isinstance(config, Mapping):
            raise InvalidArgument(f"{where}: config must be an object")
        hints = _type_hints(cls)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise InvalidArgument(
                f"{where}: unknown config key(s) {unknown} (known: {sorted(known)})"
            )
        values = {}
        missing = [
            f.name
            for f in fields(cls)
            if f.default is MISSING and f.default_factory is MISSING and f.name not in config
        ]
        if missing:
            raise InvalidArgument(f"{where}: config needs {missing}")
        for f in fields(cls):
            if f.name not in config:
                continue
            value = config[f.name]
            if allow_refs and isinstance(value, str) and _REF.fullmatch(value):
                continue
            values[f.name] = _check(value, hints[f.name], f"{where}: config {f.name!r}")
        if len(values) < len([f for f in fields(cls) if f.name in config]):
            return None  # references stand in for some values: checked again once resolved
        try:
            return cls(**values)
        except InvalidArgument as e:  # a model's own checks (__post_init__)
            raise InvalidArgument(f"{where}: {e}") from e


def _check(value: Any, hint: Any, what: str) -> Any:
    """``value`` as type ``hint`` (str, int, float, bool, Any, Mapping, list, Literal, X | None)."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        errors = []
        for arm in typing.get_args(hint):
            if arm is type(None):
                continue
            try:
                return _check(value, arm, what)
            except InvalidArgument as e:
                errors.append(str(e))
        raise InvalidArgument(errors[0] if errors else f"{what} is invalid")
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            raise InvalidArgument(f"{what} must be one of {list(typing.get_args(hint))}")
        return value
    if origin in (list, tuple, Sequence) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise InvalidArgument(f"{what} must be a list")
        args = typing.get_args(hint)
        return [_check(v, args[0], what) for v in value] if args else list(value)
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise InvalidArgument(f"{what} must be an object")
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise InvalidArgument(f"{what} must be true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(f"{what} must be an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidArgument(f"{what} must be a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str) or not value:
            raise InvalidArgument(f"{what} must be a non-empty string")
        return value
    raise TypeError(f"unsupported config type {hint!r}")


# ---------------------------------------------------------------------------- the interface


class SourceKind:
    """Base class of source kinds. One instance per process serves every thread: keep it
    stateless or thread-safe. Import heavy client libraries inside methods, so importing the
    gateway never imports them."""

    #: The kind's name as stored in the catalog (set by the registry from the entry point).
    name: str = ""
    #: Rank in the primary-key view: data flows hot -> cold, so hotter kinds rank higher.
    dedupe_tier: ClassVar[int] = 0
    #: A store where a key names one row (a PostgreSQL table, a DuckLake table): rows moved
    #: into it for a table with a primary key replace those of their keys (``Merges``), where
    #: log-structured formats (Iceberg, Delta, files) take them as appends.
    keyed_store: ClassVar[bool] = False
    #: DoPut may write several uploads into this kind, each from the states of the ones before
    #: it, before their versions commit together (``core.write.ingest._Pending``). Only where a
    #: retry after that commit failed never writes an earlier upload's rows a second time: a
    #: kind that reuses what a retry finds past the published state must not reuse a write
    #: that holds another upload's rows too (Iceberg drops those: ``_after_state``).
    group_appends: ClassVar[bool] = False
    #: The typed config (a ``SourceConfig`` subclass).
    config_model: ClassVar[type[SourceConfig]] = SourceConfig
    #: The client library's modules the kind's first plan or read imports (``warm``).
    warm_imports: ClassVar[tuple[str, ...]] = ()

    def plan(self, request: ScanRequest) -> list[ScanTask]:
        raise NotImplementedError

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        raise NotImplementedError

    def parse_config(self, source: SourceRef) -> Any:
        """The source's config as its typed model (resolved configs: at read and write time)."""
        return self.config_model.parse(source.config, where=f"source {source.name!r}")

    def validate_config(self, name: str, config: Mapping[str, Any]) -> None:
        """Check a config before it is committed (``${NAME}`` references not yet resolved)."""
        self.config_model.parse(config, where=f"source {name!r}", allow_refs=True)

    def validate_state(self, name: str, state: Mapping[str, Any]) -> None:
        """Check a state before it is committed; INVALID_ARGUMENT when it cannot be read."""

    def warm(self) -> None:
        """Make ahead, off every request's path, what the kind's first read in a process
        would pay once: here, import ``warm_imports`` (a fresh gateway's first plan of an
        Iceberg table imported pyiceberg's 250 modules, 0.5-0.8 s; Paimon's catalog 700
        modules, 0.7-0.9 s); DuckLake also makes a database past its first attach. The
        gateway calls it in a thread of its own when it starts with sources of the kind in
        its catalog and when a source of the kind is added; failures are logged, never raised
        to a caller."""
        import importlib

        for module in self.warm_imports:
            importlib.import_module(module)

    def check(self, source: SourceRef) -> None:
        """Check a resolved config with a state before it is committed or read; raise
        INVALID_ARGUMENT when they are unsafe or inconsistent (e.g. file paths in the state
        that leave the source's root)."""

    def reaches(self, source: SourceRef) -> list[Reach]:
        """Everything the (resolved) config makes the gateway touch: paths, hosts, URIs, in the
        form the kind's library will use them (build them with ``planners.locations``). The
        gateway refuses the source unless each is allowed (docs/security.md). A kind that
        reaches nothing outside the gateway returns []. This default treats config keys that
        name places or services as such (``planners.locations.default_reaches``) and refuses
        network-like keys it cannot interpret."""
        from planners import locations

        return locations.default_reaches(source.config)

    def tier(self, source: SourceRef) -> int:
        configured = source.config.get("tier")
        return int(configured) if configured is not None else self.dedupe_tier


@runtime_checkable
class Appendable(Protocol):
    """DoPut and small Spark writes: append validated rows (harness names and types) and return
    the source's new state, idempotently by ``ctx.commit_id``: a retry of the same commit id
    (after a lost reply or a crash before the harness commit) writes nothing twice."""

    def append(self, ctx: AppendContext, rows: pa.Table) -> dict[str, Any]: ...


@runtime_checkable
class PreparesAppends(Protocol):
    """An ``Appendable`` that can write an append's data before the source's lease is taken,
    so that under the lease only its commit is left (DESIGN §18: writers hold locks for
    milliseconds). ``prepare_append`` returns what ``append`` then finds as ``ctx.prepared``
    (``append`` may still write the rows itself, when what was prepared no longer fits the
    source); ``discard_prepared`` removes what an append never committed (the DoPut failed,
    or an earlier try of its commit id had written the rows)."""

    def prepare_append(self, ctx: AppendContext, rows: pa.Table) -> Any: ...

    def discard_prepared(self, ctx: AppendContext, prepared: Any) -> None: ...


@runtime_checkable
class AppendsMany(Protocol):
    """An ``Appendable`` with ``group_appends`` that writes a DoPut group's uploads into one
    source in one step (an Iceberg transaction of one snapshot per upload: one metadata file
    and one catalog commit for all of them, where each upload's own commit had cost a lock
    holder 0.2-1.4 s on a loaded machine). ``rows[i]`` is appended for ``ctxs[i]``, in order,
    each on top of the one before, starting from ``ctxs[0].source.state`` (every context
    carries that state); it returns the state after each, one per upload, idempotently by
    each ``ctx.commit_id`` as ``append`` is. When it raises, every upload of the step fails
    and none is published; retries find by commit id what was written."""

    def append_many(
        self, ctxs: Sequence[AppendContext], rows: Sequence[pa.Table]
    ) -> list[dict[str, Any]]: ...


@runtime_checkable
class Merges(Protocol):
    """DoPut with row operations (``mode: "merge"``): ``upserts`` replace every earlier row of
    their primary key ``key`` (harness names), ``deletes`` (the key columns only) remove every
    row of theirs; at most one row per key in each. One new state, idempotent by
    ``ctx.commit_id`` like ``append``."""

    def merge(
        self, ctx: AppendContext, upserts: pa.Table, deletes: pa.Table, key: Sequence[str]
    ) -> dict[str, Any]: ...


@runtime_checkable
class Drains(Protocol):
    """A hot source rows can be moved out of (``harness.move``): ``drain`` takes out of the
    source the rows it held at state ``moved`` (``rows``: what the move read of them, at least
    the key columns ``key``) and returns the source's new state, computed from its state now
    (``ctx.source.state``: writes may have committed since ``moved``). ``partial``: only the rows
    of a filter were moved (a kind that can only move all raises INVALID_ARGUMENT). Idempotent:
    a move repeated after a crash drains the same rows again."""

    def drain(
        self,
        ctx: AppendContext,
        moved: Mapping[str, Any],
        rows: pa.Table,
        key: Sequence[str],
        partial: bool,
    ) -> dict[str, Any]: ...


@runtime_checkable
class AdoptsFiles(Protocol):
    """Engines write Parquet files into ``staging_location`` (executors of a Spark write, a
    compaction job); ``adopt_files`` makes them part of the source's new state in one step
    (``replace``: they become its only files, for overwrite and compaction). Idempotent by
    ``commit_id``."""

    def staging_location(self, source: SourceRef, write_id: str) -> str: ...

    def adopt_files(
        self,
        source: SourceRef,
        files: Sequence[str],
        *,
        replace: bool,
        commit_id: str,
        relocation: bool,
    ) -> dict[str, Any]: ...


@runtime_checkable
class RewritesFiles(Protocol):
    """Optimistic maintenance (DESIGN §18): ``rewrite_files`` makes ``files`` replace what the
    source held at state ``replaced`` (the state a compaction read), keeping what was added
    since (``source.state`` is the state now), without any lock held while the files were
    written. CONFLICT when something it replaces is no longer current (another rewrite, an
    overwrite, rows deleted since): the rewrite reads again, never the writer. Idempotent by
    ``commit_id``. ``only`` (a bin-pack compaction): the files of ``replaced`` that ``files``
    replace, as the kind's direct tasks name them; the others stay. INVALID_ARGUMENT when one
    was not listed at ``replaced``."""

    def rewrite_files(
        self,
        source: SourceRef,
        replaced: Mapping[str, Any],
        files: Sequence[str],
        *,
        commit_id: str,
        only: Sequence[str] | None = None,
    ) -> dict[str, Any]: ...


@runtime_checkable
class EvolvesSchema(Protocol):
    """Sources with a schema of their own: apply the additive part of a schema change (new
    columns, widened types) idempotently, before the harness commits the new schema."""

    def apply_additive(self, source: SourceRef, changes: Sequence[Additive]) -> None: ...


@runtime_checkable
class Streams(Protocol):
    """Rows added between two states of a source (streaming reads with ``since``).

    ``plan_added(request, before)`` plans tasks reading exactly the rows added from state
    ``before`` (None: the source did not exist) to ``request.source.state``. A task may be
    served later at any version (tasks must not depend on the pinned state to find their rows).
    ``cumulative``: True when that is exact over any number of commits, relocations included
    (Kafka offsets); False when the gateway must call it commit by commit, skipping commits that
    relocate rows (files, Iceberg, Postgres).
    """

    cumulative: bool

    def plan_added(
        self, request: ScanRequest, before: Mapping[str, Any] | None
    ) -> list[ScanTask]: ...


@dataclass(frozen=True)
class DirectFiles:
    """What a client needs to read a task itself: the files (absolute paths or URIs) and their
    format, and the Parquet field id of each harness column where files carry them (Iceberg)."""

    format: str
    files: tuple[str, ...]
    field_ids: Mapping[str, int] = field(default_factory=dict)


@runtime_checkable
class ReadsDirect(Protocol):
    """File-based kinds whose tasks a client may execute where it runs (pinning, planning and
    permissions stay in the gateway). ``direct_files`` returns None for a task that must go
    through the gateway (e.g. data files with delete files the client would have to apply)."""

    def direct_files(self, request: ScanRequest, task: ScanTask) -> DirectFiles | None: ...


@dataclass(frozen=True)
class ParquetScan:
    """Parquet files an SQL engine scans itself for a source's tasks: exactly the pinned files,
    mapped to harness columns like a direct task (Parquet field id where ``field_ids`` names
    one and the file carries it, else the first of the column's names the file has; missing
    columns are NULL; types cast to the harness type)."""

    files: tuple[str, ...]
    field_ids: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PostgresScan:
    """One SELECT an SQL engine runs on the source's PostgreSQL server (DuckDB's postgres
    extension): ``query`` yields the pinned rows exactly (as-of predicate and all), its output
    column ``columns[name]`` holding harness column ``name`` (NUMERIC as text, so nothing is
    rounded on the way). ``dsn`` carries credentials: it never leaves the gateway."""

    dsn: str
    query: str
    columns: Mapping[str, str]
    #: The server's row estimate for the scanned tables, when it has one: the engine copies
    #: small results in first, so its join planning knows their size.
    estimated_rows: int | None = None


EngineScan = ParquetScan | PostgresScan


@runtime_checkable
class ScansInEngine(Protocol):
    """Kinds whose pinned scan an SQL engine (the gateway's Flight SQL DuckDB) can run itself,
    with its own parallel scan, projection, filter pushdown and row-group pruning, instead of
    reading the harness stream. ``engine_scan`` receives every task the kind planned for the
    request and describes all of them, or returns None when it cannot (delete files to apply,
    a format the engine cannot map exactly): the engine then streams ``read`` as usual. The
    relation must hold exactly the rows of ``read`` over the tasks before the residual filter
    (a superset of the filtered rows is fine: the engine applies the statement's filter)."""

    def engine_scan(self, request: ScanRequest, tasks: Sequence[ScanTask]) -> EngineScan | None: ...


def parquet_engine_scan(
    kind: ReadsDirect, request: ScanRequest, tasks: Sequence[ScanTask]
) -> ParquetScan | None:
    """The engine scan of a ``ReadsDirect`` kind: the Parquet files of its direct tasks, None
    when one task cannot be read directly or is not Parquet."""
    files: list[str] = []
    ids: dict[str, int] = {}
    for task in tasks:
        direct = kind.direct_files(request, task)
        if direct is None or direct.format != "parquet":
            return None
        files.extend(direct.files)
        ids.update(direct.field_ids)
    request.check_files("data file", files)
    return ParquetScan(tuple(files), ids)


@dataclass(frozen=True)
class Pinned:
    """A source as one retained version of one table pins it (config resolved)."""

    table: str
    version: int
    source: SourceRef
    #: The maintained catalog's tag (``AppendContext.catalog_tag``): files named with another
    #: tag are another catalog's, never this one's to delete ("": none known).
    catalog_tag: str = ""
    #: The operator said the roots are this catalog's alone (``maintain --clean-untagged``):
    #: files named before names carried a tag are this catalog's too.
    clean_untagged: bool = False


@runtime_checkable
class Maintains(Protocol):
    """Housekeeping that respects pins (``harness-gateway maintain``): ``maintain`` receives every
    source of this kind that a retained version of any table pins, and must never remove what
    one of them reads. It returns what it did, as JSON: ``deleted_files`` (list), ``expired``
    (``{name: count}``) and ``lost`` (``{"table/source": rows a pin can no longer read}``)."""

    def maintain(self, pinned: Sequence[Pinned], grace_s: float) -> dict[str, Any]: ...


@runtime_checkable
class HoldsResources(Protocol):
    """A kind that holds resources for the whole process (the ``kafka`` kind: its open
    consumers, each with threads and fetch buffers). ``configure_resources`` receives the
    gateway config's ``limits.kinds.<kind>`` (``{}`` for the defaults; ValueError for a setting
    it does not know); ``resources`` says what it holds now (name -> number, for the metrics)."""

    def configure_resources(self, settings: Mapping[str, Any]) -> None: ...

    def resources(self) -> Mapping[str, float]: ...


@runtime_checkable
class HasCommands(Protocol):
    """Adds sub-commands to the ``harness-gateway`` CLI (``add_commands`` receives the
    sub-parser collection; each parser's ``func`` default runs the command)."""

    def add_commands(self, subparsers: Any) -> None: ...
