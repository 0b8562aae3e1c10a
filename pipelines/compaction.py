"""Compaction without Spark: rewrite one source's rows as a few Parquet files in one harness
commit (``compact``), or only its small files as one (``bin_pack``), through the gateway's
engine-write actions (any kind that adopts files; the Spark job is
``pipelines.spark_jobs.compact``).

``compact`` reads the rows through the gateway at one pinned version, so row-level deletes
(Iceberg position and equality deletes) are applied: the rewritten files hold no deleted row, and the
delete files no longer apply to anything (Iceberg applies an equality delete to data of a
lower sequence number only). The commit is a relocation, so streaming readers do not see the
rows again; readers pinned to older versions keep reading the old files. ``bin_pack`` reads
the small files itself with the gateway's direct tasks, which exist only where no delete
applies. Both are optimistic (DESIGN §18): writers to the source go on meanwhile and their
rows stay.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from clients import HarnessClient
from clients.direct import run
from flight_gateway.protocol.direct import DirectTask
from flight_gateway.protocol.errors import Conflict
from pipelines.mover import MoveResult

log = logging.getLogger(__name__)


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a staging location (a local path or a URI)."""
    if "://" in location:
        fs, path = pafs.FileSystem.from_uri(location)
        return fs, path
    return pafs.LocalFileSystem(), location


def _strict(data: pa.Table) -> pa.Table:
    """Columns without nulls as required fields: a source may declare them required (an
    Iceberg key column) while the harness column is nullable; required data fits both."""
    fields = [
        f.with_nullable(f.nullable and data.column(f.name).null_count > 0) for f in data.schema
    ]
    return data.cast(pa.schema(fields))


def rewrite_source(
    client: HarnessClient,
    table: str,
    source: str,
    write: Callable[[int, str], tuple[list[str], int]],
    *,
    attempts: int = 5,
) -> MoveResult:
    """Optimistic (DESIGN §18): ``write(pinned version, staging location)`` writes the
    source's rows at that version as files there and returns (their paths, row count); they
    replace what the source held at that version in one relocation commit, and rows written
    since stay. No lock is held while the rows are read and written, so writers never wait for
    it; when the source was rewritten or deleted from meanwhile (a CONFLICT) it reads again,
    up to ``attempts`` times. The staged files are removed if anything fails."""
    result = _rewrite(client, table, source, write, attempts)
    assert result is not None  # without ``pick`` there is always something to rewrite
    return result


def _rewrite(
    client: HarnessClient,
    table: str,
    source: str,
    write: Callable[[int, str], tuple[list[str], int]],
    attempts: int,
    pick: Callable[[int], list[str]] | None = None,
) -> MoveResult | None:
    """``rewrite_source``; ``pick(pinned version)``: the files the rewrite replaces
    (``replaces``), the others staying; none picked: nothing is rewritten (None)."""
    for attempt in range(1, attempts + 1):
        pinned = client.describe(table).version
        replaces = pick(pinned) if pick is not None else None
        if replaces is not None and not replaces:
            return None
        begun = client.begin_write(table, source)
        if begun["mode"] != "stage":
            raise ValueError(f"source {source!r} cannot be compacted: its kind adopts no files")
        try:
            written, rows = write(pinned, begun["location"])
            version = client.commit_write(
                table,
                begun["write_id"],
                written,
                source=source,
                overwrite=True,
                relocation=True,
                rows=rows,
                read_version=pinned,
                replaces=replaces,
            )
        except Conflict as e:
            client.abort_write(table, begun["write_id"], source)
            if attempt == attempts:
                raise
            log.info("rewrite of %s/%s read version %d: %s; again", table, source, pinned, e)
            continue
        except BaseException:
            client.abort_write(table, begun["write_id"], source)
            raise
        log.info("compacted %s/%s (%s files) into %d files as version %d", table, source,
                 "all" if replaces is None else len(replaces), len(written), version)  # fmt: skip
        return MoveResult(version, rows)
    raise AssertionError("unreachable")


def _write_files(location: str, data: pa.Table, rows_per_file: int) -> list[str]:
    """``data`` as Parquet files of up to ``rows_per_file`` rows under ``location``."""
    data = _strict(data)
    fs, root = filesystem(location)
    written = []
    for start in range(0, max(data.num_rows, 1), rows_per_file):
        name = f"compacted-{uuid.uuid4().hex}.parquet"
        with fs.open_output_stream(f"{root}/{name}") as out:
            pq.write_table(
                data.slice(start, rows_per_file), out, store_decimal_as_integer=True
            )  # decimals as Spark, DuckDB and the files kind write them (planners.files)
        written.append(f"{location.rstrip('/')}/{name}")
    return written


#: Rows per file a compaction writes.
ROWS_PER_FILE = 4_000_000
#: Bin-pack: files under this size are small, rewritten together (Iceberg's rewrite strategy
#: of the same name; its default target is 512 MB, and files under 75 % of it are rewritten).
SMALL_FILE_BYTES = 32 << 20
#: Bin-pack: fewer small files than this are left as they are.
MIN_SMALL_FILES = 5


def file_sizes(paths: Sequence[str]) -> list[int]:
    """Each file's size (local paths or URIs), one listing call per filesystem."""
    by_fs: dict[tuple[str, str], tuple[pafs.FileSystem, list[tuple[int, str]]]] = {}
    for i, path in enumerate(paths):
        fs, local = filesystem(path)
        where = (fs.type_name, urlsplit(path).netloc)  # one bucket of one store, or local
        by_fs.setdefault(where, (fs, []))[1].append((i, local))
    sizes = [0] * len(paths)
    for fs, entries in by_fs.values():
        for (i, _), info in zip(entries, fs.get_file_info([p for _, p in entries]), strict=True):
            sizes[i] = int(info.size or 0)
    return sizes


def small_files(
    client: HarnessClient, table: str, source: str, version: int, small_bytes: int
) -> list[tuple[DirectTask, str]] | None:
    """The files of ``source`` at ``version`` under ``small_bytes``, each with the direct task
    that reads it (its columns, as the harness maps them); None when some of the source must
    be read through the gateway (row deletes to apply, or direct tasks not allowed): then
    only a whole rewrite (``compact``) applies them."""
    info = client.flight_info(table, version=version, sources=[source], direct=True)
    tasks = [client.direct_task(ep) for ep in info.endpoints]
    if any(t is None or t.filter is not None for t in tasks):  # a filter would drop rows
        return None
    files = [(t, f) for t in tasks if t is not None for f in t.files]
    sizes = file_sizes([f for _, f in files])
    return [tf for tf, size in zip(files, sizes, strict=True) if size < small_bytes]


def bin_pack(
    client: HarnessClient,
    table: str,
    source: str,
    *,
    small_bytes: int = SMALL_FILE_BYTES,
    min_files: int = MIN_SMALL_FILES,
    attempts: int = 5,
) -> MoveResult | None:
    """Rewrite the small files of ``source`` as one file (``harness.commit_write`` with
    ``replaces``): the other files stay, so a run costs what writers added since the last one
    rather than the whole source, and keeps up with them however large the source grows. None
    when it has fewer than ``min_files`` small files. Optimistic like ``rewrite_source``:
    CONFLICT (those files rewritten meanwhile) reads again. ValueError when the source must be
    read through the gateway (``small_files``): compact it whole."""
    chosen: list[tuple[DirectTask, str]] = []

    def pick(pinned: int) -> list[str]:
        small = small_files(client, table, source, pinned, small_bytes)
        if small is None:
            raise ValueError(f"source {source!r} has files only the gateway reads: compact it")
        chosen[:] = small if len(small) >= min_files else []
        return [f for _, f in chosen]

    def write(pinned: int, location: str) -> tuple[list[str], int]:
        by_task: dict[int, tuple[DirectTask, list[str]]] = {}
        for task, f in chosen:  # each task's small files in one read
            by_task.setdefault(id(task), (task, []))[1].append(f)
        data = pa.concat_tables(
            [run(replace(t, files=tuple(files))) for t, files in by_task.values()]
        )
        return _write_files(location, data, ROWS_PER_FILE), data.num_rows

    return _rewrite(client, table, source, write, attempts, pick)


def compact(
    client: HarnessClient, table: str, source: str, *, rows_per_file: int = ROWS_PER_FILE
) -> MoveResult:
    def write(pinned: int, location: str) -> tuple[list[str], int]:
        data = client.read(table, version=pinned, sources=[source])
        return _write_files(location, data, rows_per_file), data.num_rows

    return rewrite_source(client, table, source, write)
