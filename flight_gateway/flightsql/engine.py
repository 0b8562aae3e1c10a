"""DuckDB running one Flight SQL statement over the relations of its pinned tables.

Each statement gets its own DuckDB connection, configured before anything of the caller's runs:
memory limit with spilling to a per-statement temporary directory (removed afterwards), a bound
on that directory, threads, UTC session time zone, no extension auto-loading. The harness
relations are then created as views (``__harness_<n>``): DuckDB's own Parquet reader over the
pinned files of file-based sources, a ``postgres_query`` on an ``ATTACH``ed server for
PostgreSQL sources, the harness stream for the rest. Only then is external access switched off
(``allowed_paths``: exactly the pinned files; ``allowed_directories``: the spill directory) and
the configuration locked, so the caller's SQL cannot read files, attach databases, load
extensions or change a setting. The result leaves as DuckDB produces it; a timer interrupts a
statement that runs past its time.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flight_gateway.errors import (
    HarnessError,
    InvalidArgument,
    ResourceExhausted,
    TimedOut,
    Unavailable,
)
from planners.kind import ParquetScan, PostgresScan

if TYPE_CHECKING:
    from flight_gateway.flightsql.relations import Part, TableRelation

log = logging.getLogger(__name__)
#: Each column's names, current first (a file written before a rename has an older one).
Names = Sequence[tuple[str, ...]]

#: Rows per result batch (a few MB for typical rows: what Flight streams best).
BATCH_ROWS = 64 * 1024
#: A Postgres scan estimated below this many rows is copied into DuckDB before the statement
#: runs: DuckDB knows no row count for ``postgres_query`` and can order joins badly around it
#: (TPC-H Q5 with supplier in Postgres: 1.9 s -> 1.4 s at SF 0.5).
SMALL_SCAN_ROWS = 100_000


@dataclass(frozen=True)
class SqlLimits:
    """Per-statement bounds (``limits.sql_*`` in the gateway config)."""

    memory_limit_mb: int = 1024
    threads: int = 0  # 0: one per core
    timeout_s: float = 300.0
    spill_limit_mb: int = 10 * 1024
    temp_dir: str | None = None  # None: the system's temporary directory


def _quote(text: str) -> str:
    """A DuckDB string literal."""
    return "'" + text.replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def connect(limits: SqlLimits, dsns: Sequence[str] = ()) -> Any:
    """A new DuckDB database with the statement limits, each PostgreSQL server of ``dsns``
    attached read-only as ``__pg_<i>``; nothing of a caller's has run on it yet."""
    import duckdb

    config: dict[str, Any] = {
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "memory_limit": f"{int(limits.memory_limit_mb)}MB",
        "threads": int(limits.threads) or (os.cpu_count() or 1),
    }
    con = duckdb.connect(config=config)
    try:
        con.execute("SET TimeZone = 'UTC'")  # results do not depend on the gateway's zone
        if dsns:
            _load(con, "postgres")
        for i, dsn in enumerate(dsns):
            con.execute(f"ATTACH {_quote(dsn)} AS __pg_{i} (TYPE postgres, READ_ONLY)")
    except Exception as e:
        con.close()
        if isinstance(e, HarnessError):
            raise
        raise Unavailable(f"cannot connect to PostgreSQL: {e}") from e
    return con


def _load(con: Any, extension: str) -> None:
    import duckdb_extensions

    try:
        duckdb_extensions.import_extension(extension, con=con)
    except Exception as e:  # the matching extension wheel is a dependency
        raise Unavailable(f"DuckDB extension {extension!r} is not installed: {e}") from e


def use_spill(con: Any, spill: str, limits: SqlLimits) -> None:
    con.execute(f"SET temp_directory = {_quote(spill)}")
    con.execute(f"SET max_temp_directory_size = '{int(limits.spill_limit_mb)}MB'")


def postgres_servers(relations: Sequence[TableRelation]) -> tuple[str, ...]:
    """The PostgreSQL servers (DSNs) a statement's relations scan, in a stable order."""
    dsns = {p.scan.dsn for r in relations for p in r.parts if isinstance(p.scan, PostgresScan)}
    return tuple(sorted(dsns))


def duckdb_types(con: Any, schema: pa.Schema) -> list[str]:
    """DuckDB's type for each field of ``schema`` (as DuckDB maps the Arrow type)."""
    name = "__harness_types"
    con.register(name, schema.empty_table())
    try:
        return [row[1] for row in con.execute(f"DESCRIBE {name}").fetchall()]
    finally:
        con.unregister(name)


class Builder:
    """Creates the ``__harness_<n>`` views of one statement on ``con``."""

    def __init__(self, con: Any, dsns: Sequence[str]) -> None:
        self.con = con
        self.files: list[str] = []
        self._attached = {dsn: f"__pg_{i}" for i, dsn in enumerate(dsns)}
        self._streams = 0

    def view(self, index: int, rel: TableRelation, materialize: bool) -> None:
        types = duckdb_types(self.con, rel.schema)
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
        self.con.execute(f"CREATE TEMP VIEW __harness_{index} AS {body}")

    def _part(self, part: Part, names: Names, types: list[str], materialize: bool) -> list[str]:
        if isinstance(part.scan, ParquetScan):
            return self._parquet(part, part.scan, names, types)
        if isinstance(part.scan, PostgresScan):
            return [self._postgres(part, part.scan, names, types)]
        return [self._stream(part, names, materialize)]

    # ------------------------------------------------------------------ Parquet

    def _footers(self, files: Sequence[str]) -> dict[str, list[tuple[str, int | None]]]:
        """Top-level (name, field id) of each file, from the Parquet footers."""
        rows = self.con.execute(
            "SELECT file_name, name, field_id, num_children FROM parquet_schema(?)", [list(files)]
        ).fetchall()
        by_file: dict[str, list[tuple[str, int | None, int]]] = {}
        for file, name, fid, children in rows:
            by_file.setdefault(file, []).append((name, fid, children or 0))
        out: dict[str, list[tuple[str, int | None]]] = {}
        for file, elems in by_file.items():
            top, i = [], 1
            for _ in range(elems[0][2]):  # the root's children, skipping nested elements
                top.append((elems[i][0], elems[i][1]))
                i = _skip(elems, i)
            out[file] = top
        return out

    def _parquet(self, part: Part, scan: ParquetScan, names: Names, types: list[str]) -> list[str]:
        files = list(scan.files)
        if not files:
            return []  # the tasks hold no file: no rows from this source
        self.files.extend(files)
        footers = self._footers(files)
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
            out.append(
                f"SELECT {', '.join(cols)} FROM read_parquet([{listed}], union_by_name=true)"
            )
        return out

    # ------------------------------------------------------------------ PostgreSQL

    def _postgres(self, part: Part, scan: PostgresScan, names: Names, types: list[str]) -> str:
        alias = self._attached[scan.dsn]  # connect() attached every server
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
        self.con.execute(f"CREATE TEMP TABLE {name} AS {select}")
        return f"SELECT * FROM {name}"

    # ------------------------------------------------------------------ streams

    def _stream(self, part: Part, names: Names, materialize: bool) -> str:
        assert part.open is not None
        name = f"__stream_{self._streams}"
        self._streams += 1
        reader = part.open()
        self.con.register(name, reader)
        if materialize:  # read several times: DuckDB keeps it (spilling past its memory limit)
            self.con.execute(f"CREATE TEMP TABLE {name}_rows AS SELECT * FROM {name}")
            self.con.unregister(name)
            name = f"{name}_rows"
        cols = ", ".join(_ident(n[0]) for n in names)
        return f"SELECT {cols} FROM {name}"

    # ------------------------------------------------------------------ sandbox

    def lock(self, spill: str | None) -> None:
        """External access off (only the pinned files and the spill directory), config locked."""
        paths = ", ".join(_quote(f) for f in dict.fromkeys(self.files))
        self.con.execute(f"SET allowed_paths = [{paths}]")
        if spill is not None:
            self.con.execute(f"SET allowed_directories = [{_quote(spill + os.sep)}]")
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET lock_configuration = true")


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
    con: Any, relations: Sequence[TableRelation], read_more_than_once: Sequence[bool]
) -> Builder:
    """The statement's views on ``con`` (from ``connect(limits, postgres_servers(relations))``)."""
    builder = Builder(con, postgres_servers(relations))
    for i, rel in enumerate(relations):
        builder.view(i, rel, read_more_than_once[i])
    return builder


def spill_directory(limits: SqlLimits) -> str:
    return tempfile.mkdtemp(prefix="harness-sql-", dir=limits.temp_dir)


def translate(e: BaseException, limits: SqlLimits) -> BaseException:
    """A DuckDB failure as the harness error a caller should see."""
    import duckdb

    if isinstance(e, HarnessError):
        return e
    if isinstance(e, duckdb.InterruptException):
        return TimedOut(
            f"the statement ran longer than limits.sql_timeout_s ({limits.timeout_s:g} s) and "
            "was stopped"
        )
    if isinstance(e, duckdb.OutOfMemoryException):
        return ResourceExhausted(
            "the statement needed more than limits.sql_memory_limit_mb "
            f"({limits.memory_limit_mb} MB, spilling up to {limits.spill_limit_mb} MB): {e}"
        )
    if isinstance(e, duckdb.IOException):
        return Unavailable(f"the statement could not read a source: {e}")
    if isinstance(e, duckdb.Error):
        return InvalidArgument(f"the query failed: {e}")
    return e


def source_failure(e: BaseException) -> BaseException:
    """A failure while creating the statement's relations: a source could not be read."""
    if isinstance(e, HarnessError):
        return e
    return Unavailable(f"a source of the statement could not be read: {e}")


class Running:
    """One executing statement: its connection, spill directory and timer."""

    def __init__(self, con: Any, spill: str | None, limits: SqlLimits) -> None:
        self.con, self.spill, self.limits = con, spill, limits
        self.timer = threading.Timer(limits.timeout_s, con.interrupt)
        self.timer.daemon = True
        self.timer.start()
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.timer.cancel()
        try:
            self.con.interrupt()
            self.con.close()
        except Exception:  # closing a connection that failed: nothing left to release
            log.debug("closing a statement's DuckDB connection failed", exc_info=True)
        if self.spill is not None:
            shutil.rmtree(self.spill, ignore_errors=True)

    def stream(self, sql: str) -> pa.RecordBatchReader:
        """The result of ``sql`` as DuckDB produces it; closes everything when it ends."""
        try:
            reader = self.con.execute(sql).to_arrow_reader(BATCH_ROWS)
        except BaseException as e:
            self.close()
            raise translate(e, self.limits) from None

        def gen() -> Iterator[pa.RecordBatch]:
            try:
                yield from reader
            except BaseException as e:
                raise translate(e, self.limits) from None
            finally:
                self.close()

        return pa.RecordBatchReader.from_batches(reader.schema, gen())
