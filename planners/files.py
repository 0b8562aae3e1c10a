"""``files`` sources: an explicit list of Parquet / ORC / Arrow IPC / CSV / Avro files.

State ``{"files": [paths]}`` (relative to config ``root`` or absolute); exactly those files are
visible. Projection and the predicate go into a ``pyarrow.dataset`` scanner per run of files
sharing a schema (``planners.file_scan``; row-group statistics pruning for Parquet). Small
files are grouped into one task up to ``target_task_bytes``.

Writes: DoPut adds one Parquet file named after the commit id (a retry rewrites the same file);
engines (Spark writes, compaction) write Parquet files under ``root`` that are adopted into the
list. Streaming: the rows added between two states are the files that joined the list.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs

from flight_gateway.protocol.errors import Conflict, InvalidArgument, Unavailable
from planners import locations
from planners.avro import read_avro
from planners.common import (
    DEFAULT_BATCH_ROWS,
    chain_readers,
    filesystem,
    group_by_size,
    local_file_problem,
    physical_names,
    scan_dataset,
    target_schema,
)
from planners.file_scan import scan_files
from planners.kind import (
    AppendContext,
    ColumnSpec,
    DirectFiles,
    EngineScan,
    Pinned,
    Reach,
    ScanRequest,
    ScanTask,
    SourceConfig,
    SourceKind,
    SourceRef,
    parquet_engine_scan,
)
from planners.layout import (
    FileLayout,
    LaidFile,
    as_uri,
    name_mapping,
    parquet_footer,
    widens,
)

log = logging.getLogger(__name__)

FORMATS = {
    "parquet": "parquet",
    "orc": "orc",
    "arrow": "ipc",
    "ipc": "ipc",
    "feather": "ipc",
    "csv": "csv",
    "avro": "avro",  # decoded by fastavro (planners.avro), not by pyarrow.dataset
}


@dataclass(frozen=True, kw_only=True)
class FilesConfig(SourceConfig):
    format: Literal["parquet", "orc", "arrow", "ipc", "feather", "csv", "avro"] = "parquet"
    #: Directory (path or URI) the file names are relative to; needed for writes.
    root: str | None = None


def _inside(path: str, base: str, real_root: str | None) -> bool:
    """``path`` (a real path when ``real_root`` is given, the real root) lives under ``base``."""
    if real_root is not None:  # local: symlinks and ".." resolved
        return path == real_root or path.startswith(real_root.rstrip("/") + "/")
    return os.path.normpath(path).startswith(os.path.normpath(base).rstrip("/") + "/")


def resolve_paths(root: str | None, files: Sequence[Any]) -> tuple[pafs.FileSystem, list[str]]:
    """Full paths of a state's file names, confined to ``root`` (absolute names and ``..`` may
    not leave it; without a root, names must be absolute and the gateway's allow-list checks
    them)."""
    fs, paths, _ = _resolve(root, files)
    return fs, paths


def _resolve(
    root: str | None, files: Sequence[Any]
) -> tuple[pafs.FileSystem, list[str], list[str] | None]:
    """``resolve_paths``, and for a local root each file's real path (symlinks and ``..``
    resolved: the file that will be opened, which must live under the real root), each
    resolved once: the read checks it against the allow-lists and hands it to clients."""
    fs, base = filesystem(root or "")
    local = isinstance(fs, pafs.LocalFileSystem)
    real_root = locations.local_real(base) if local and base else None
    out = []
    for f in files:
        if not isinstance(f, str) or not f or "\x00" in f:
            raise InvalidArgument(f"file entries must be non-empty strings, got {f!r}")
        if not base and not os.path.isabs(f):
            raise InvalidArgument(f"file {f!r} is relative, but the source has no root")
        out.append(f if os.path.isabs(f) or not base else os.path.join(base, f))
    reals = locations.local_reals(out) if local else out
    if base:
        for f, real in zip(files, reals, strict=True):
            if not _inside(real, base, real_root):
                raise InvalidArgument(f"file {f!r} is outside the source's root")
    return fs, out, reals if local else None


def _regular(source: str, reals: Sequence[str], error: type[Exception]) -> None:
    """``error`` unless each local file that exists is a regular file (a missing one is the
    read's UNAVAILABLE). Checked by ``stat``, never opened: a named pipe blocks its reader
    until a writer comes, and a directory would be read as whatever files it holds."""
    for real in reals:
        why = local_file_problem(real)
        if why is not None and why != "missing":
            raise error(f"source {source!r}: {real!r} is {why}: it cannot be read as a data file")


def _uris(root: str | None, paths: list[str], reals: list[str] | None) -> list[str]:
    """Filesystem paths as locations a client can open: real local paths (the files checked,
    wherever links lead), or URIs with the root's scheme (``s3://bucket/key``)."""
    if reals is not None:
        return reals
    scheme = root.split("://", 1)[0] if root and "://" in root else ""
    return [f"{scheme}://{p}" if scheme else p for p in paths]


def _write_once(fs: pafs.FileSystem, path: str, rows: pa.Table) -> None:
    """Write ``path`` unless it exists, never overwriting: the data goes to a temporary name
    first and is moved into place whole, so an existing file is always a complete earlier try
    of the same commit."""
    import pyarrow.parquet as pq

    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        return
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with fs.open_output_stream(tmp) as out:
        # Decimals of up to 18 digits as INT32/INT64, as Spark, DuckDB, pyiceberg and delta-rs
        # write them, not pyarrow's fixed-length bytes: DuckDB scans them ~1.4x faster (TPC-H
        # lineitem, Q6), and every Parquet reader reads both.
        pq.write_table(rows, out, store_decimal_as_integer=True)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        fs.move(tmp, path)
    else:
        fs.delete_file(tmp)


def _file_list(source: str, state: Mapping[str, Any]) -> list[str]:
    files = state.get("files", [])
    if not isinstance(files, list) or not all(isinstance(f, str) and f for f in files):
        raise InvalidArgument(f"source {source!r}: state 'files' must be a list of file names")
    return list(files)


def _require_root(source: SourceRef, config: FilesConfig) -> str:
    if not config.root:
        raise InvalidArgument(f"source {source.name!r}: writing needs config 'root'")
    return config.root.rstrip("/")


class FilesKind(SourceKind):
    group_appends = True  # one file per commit id, states from the published list
    config_model = FilesConfig
    cumulative = False  # compaction rewrites the list: streaming compares commit by commit

    def validate_state(self, name: str, state: Mapping[str, Any]) -> None:
        _file_list(name, state)

    def check(self, source: SourceRef) -> None:
        config: FilesConfig = self.parse_config(source)
        _, _, reals = _resolve(config.root, _file_list(source.name, source.state))
        if reals is not None:  # a file not there yet is the read's UNAVAILABLE, as before
            _regular(source.name, reals, InvalidArgument)

    def reaches(self, source: SourceRef) -> list[Reach]:
        config: FilesConfig = self.parse_config(source)
        if config.root:
            return locations.storage("root", config.root)
        return locations.files("files", _file_list(source.name, source.state))

    def _paths(
        self, request: ScanRequest, files: list[str]
    ) -> tuple[pafs.FileSystem, list[str], list[str]]:
        """The filesystem paths of ``files``, each checked against the gateway's allow-lists
        where it really is (symlinks inside the root may point anywhere), and the locations
        a client opens them at (``_uris``)."""
        config: FilesConfig = self.parse_config(request.source)
        fs, paths, reals = _resolve(config.root, files)
        uris = _uris(config.root, paths, reals)
        if reals is None:
            request.check_files("data file", uris)
        else:
            request.check_real_files("data file", reals)
        return fs, paths, uris

    # ------------------------------------------------------------------ reading

    def _tasks(self, request: ScanRequest, files: list[str]) -> list[ScanTask]:
        src = request.source
        config: FilesConfig = self.parse_config(src)
        fs, paths, _ = self._paths(request, files)
        infos = fs.get_file_info(paths) if paths else []
        for info in infos:
            if info.type == pafs.FileType.NotFound:
                raise Unavailable(f"source {src.name!r}: file {info.path!r} is missing")
            if info.type != pafs.FileType.File:  # an object store's "directory"
                raise Unavailable(f"source {src.name!r}: {info.path!r} is not a regular file")
        groups = group_by_size(
            [(name, info.size) for name, info in zip(files, infos, strict=True)],
            config.target_task_bytes,
        )
        return [ScanTask(src.name, {"files": g}, exact_filter=True) for g in groups]

    def plan(self, request: ScanRequest) -> list[ScanTask]:
        return self._tasks(request, _file_list(request.source.name, request.source.state))

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        src = request.source
        config: FilesConfig = self.parse_config(src)
        fmt = FORMATS[config.format]
        fs, paths, _ = self._paths(request, list(task.payload["files"]))
        if isinstance(fs, pafs.LocalFileSystem):
            # Replaced since planning (by a pipe, a directory): UNAVAILABLE before any open.
            # Planning saw each file's type already (``_tasks``, get_file_info).
            _regular(src.name, paths, Unavailable)
        if fmt != "avro":
            return scan_files(request, fs, paths, fmt)

        def one(path: str) -> pa.RecordBatchReader:
            try:
                data = read_avro(fs, path, DEFAULT_BATCH_ROWS)
            except (FileNotFoundError, OSError, ValueError) as e:
                raise Unavailable(f"source {src.name!r}: cannot open {path!r}: {e}") from e
            return scan_dataset(request, data)

        if len(paths) == 1:
            return one(paths[0])
        return chain_readers(target_schema(request.columns), (one(p) for p in paths))

    def engine_scan(self, request: ScanRequest, tasks: Sequence[ScanTask]) -> EngineScan | None:
        return parquet_engine_scan(self, request, tasks)

    def direct_files(self, request: ScanRequest, task: ScanTask) -> DirectFiles | None:
        config: FilesConfig = self.parse_config(request.source)
        if FORMATS[config.format] == "avro":
            return None  # clients read Parquet/ORC/IPC/CSV with pyarrow; Avro goes through us
        _, _, uris = self._paths(request, list(task.payload["files"]))
        return DirectFiles(FORMATS[config.format], tuple(uris))

    def plan_added(self, request: ScanRequest, before: Mapping[str, Any] | None) -> list[ScanTask]:
        src = request.source
        old = set(_file_list(src.name, before)) if before else set()
        new = [f for f in _file_list(src.name, src.state) if f not in old]
        return self._tasks(request, new) if new else []

    # ------------------------------------------------------------------ as files

    def layout(self, request: ScanRequest) -> FileLayout | None:
        """Parquet files without field ids are read in place, columns matched by name; other
        formats (and files that carry field ids of their own) are made slices of."""
        config: FilesConfig = self.parse_config(request.source)
        if FORMATS[config.format] != "parquet":
            return None
        files = _file_list(request.source.name, request.source.state)
        fs, paths, uris = self._paths(request, files)
        laid: list[LaidFile] = []
        physical: dict[str, tuple[str, pa.DataType]] = {}
        names: set[str] = set()
        for path, uri in zip(paths, uris, strict=True):
            footer = parquet_footer(fs, path)
            if footer is None:
                return None
            size, rows, schema = footer
            names.update(schema.names)
            mapping = physical_names(request.columns, schema.names)
            found = {c: (p, schema.field(p).type) for c, p in mapping.items()}
            if laid and not _agree(physical, found, request.columns):
                return None  # files disagree on a column's name or type: one slice instead
            physical = physical or found
            laid.append(LaidFile(as_uri(uri), size, rows))
        others = frozenset(names - {p for p, _ in physical.values()})
        return FileLayout(tuple(laid), physical, other_names=others)

    def pieces(
        self, source: SourceRef, stored: Sequence[Mapping[str, Any]]
    ) -> list[Mapping[str, Any]]:
        """One piece per file: a list that grows makes one new slice per new file."""
        return [{"files": [f]} for f in _file_list(source.name, source.state)]

    # ------------------------------------------------------------------ writing

    def maintain(self, pinned: Sequence[Pinned], grace_s: float) -> dict[str, Any]:
        return maintain_files(pinned, grace_s)

    def append(self, ctx: AppendContext, rows: pa.Table) -> dict[str, Any]:
        config: FilesConfig = self.parse_config(ctx.source)
        if config.format != "parquet":
            raise InvalidArgument(f"source {ctx.source.name!r}: DoPut writes Parquet files only")
        # One name per (catalog, table, source, commit): a retry finds its file, another table
        # or another catalog sharing the root never collides with it (the same table, source
        # and commit id in two catalogs took the other's file for a retry's before the tag).
        key = f"{ctx.table}\0{ctx.source.name}\0{ctx.commit_id}".encode()
        tag = f"{ctx.catalog_tag}-" if ctx.catalog_tag else ""
        name = f"harness-{tag}{hashlib.sha256(key).hexdigest()[:32]}.parquet"
        fs, (path,) = resolve_paths(_require_root(ctx.source, config), [name])
        _write_once(fs, path, rows)
        files = _file_list(ctx.source.name, ctx.source.state)
        if name not in files:
            files.append(name)
        return {**ctx.source.state, "files": files}

    def staging_location(self, source: SourceRef, write_id: str) -> str:
        return f"{_require_root(source, self.parse_config(source))}/spark-{write_id}"

    def adopt_files(
        self,
        source: SourceRef,
        files: Sequence[str],
        *,
        replace: bool,
        commit_id: str,
        relocation: bool,
    ) -> dict[str, Any]:
        names = self._names(source, files)
        kept = [] if replace else _file_list(source.name, source.state)
        return {**source.state, "files": kept + [n for n in names if n not in kept]}

    def rewrite_files(
        self,
        source: SourceRef,
        replaced: Mapping[str, Any],
        files: Sequence[str],
        *,
        commit_id: str,
        only: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """The new files in place of the ones listed at ``replaced`` (``only``: those of them),
        and the files added since after them. A retry (its files already listed) changes
        nothing."""
        names = self._names(source, files)
        now = _file_list(source.name, source.state)
        listed = set(now)
        if names and all(n in listed for n in names):
            return dict(source.state)
        old = _file_list(source.name, replaced)
        if only is not None:
            old = self._named(source, old, only)
        gone = [f for f in old if f not in listed]
        if gone:
            raise Conflict(
                f"source {source.name!r}: {len(gone)} of the files this rewrite replaces "
                f"({gone[0]!r}, ...) were replaced since it read them: read the source again"
            )
        old_set = set(old)
        return {**source.state, "files": names + [f for f in now if f not in old_set]}

    def _named(self, source: SourceRef, listed: list[str], paths: Sequence[str]) -> list[str]:
        """The entries of ``listed`` that ``paths`` name, as direct tasks name files (real
        local paths, URIs) or as joined to the root."""
        root = self.parse_config(source).root
        _, joined, reals = _resolve(root, listed)
        entry: dict[str, str] = {}
        for name, path, uri in zip(listed, joined, _uris(root, joined, reals), strict=True):
            entry.setdefault(path, name)
            entry.setdefault(uri, name)
        missing = [p for p in paths if p not in entry]
        if missing:
            raise InvalidArgument(
                f"source {source.name!r}: {len(missing)} of the files to replace ({missing[0]!r}"
                ", ...) were not listed at the version the rewrite read"
            )
        return list(dict.fromkeys(entry[p] for p in paths))

    def _names(self, source: SourceRef, files: Sequence[str]) -> list[str]:
        root = _require_root(source, self.parse_config(source))
        names = []
        for f in files:
            if not f.startswith(root + "/"):
                raise InvalidArgument(f"source {source.name!r}: {f!r} is not under its root")
            names.append(f[len(root) + 1 :])
        return names


# ---------------------------------------------------------------------------- maintenance

#: Names the harness itself writes under a root: DoPut files, Spark staging directories.
HARNESS_FILE_PREFIXES = ("harness-", "spark-")
#: Such a name with its catalog's tag (``harness-<tag>-...``, ``spark-<tag>-...``); one
#: without a tag was written before names carried it.
_TAGGED = re.compile(r"^(?:harness|spark)-([0-9a-f]{12})-")


def _referenced(pinned: Sequence[Pinned]) -> dict[str, set[str]]:
    """Local root -> the absolute paths some retained version lists there."""
    roots: dict[str, set[str]] = {}
    seen: set[tuple[str, tuple[str, ...]]] = set()  # most versions repeat an earlier list
    for p in pinned:
        root = p.source.config.get("root")
        if isinstance(root, str) and "://" not in root:
            files = tuple(_file_list(p.source.name, p.source.state))
            if (root, files) in seen:
                continue
            seen.add((root, files))
            roots.setdefault(root, set()).update(
                os.path.normpath(os.path.join(root, f)) for f in files
            )
    return roots


def _harness_written(root: str) -> Iterator[tuple[str, str]]:
    """(path, the name of its first level under ``root``) of every file under ``root`` whose
    first level the harness named."""
    for dirpath, _dirs, names in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in names:
            first = (name if rel == "." else rel).split(os.sep)[0]
            if first.startswith(HARNESS_FILE_PREFIXES):
                yield os.path.normpath(os.path.join(dirpath, name)), first


def _clean_root(
    root: str, keep: set[str], grace_s: float, tag: str = "", clean_untagged: bool = False
) -> list[str]:
    """Delete the files this catalog (``tag``) wrote under ``root`` that no pin lists and that
    are older than ``grace_s`` (a write not committed yet is younger); others are never
    touched. Files another catalog's tag names are that catalog's. Untagged ones (written by a
    release before names carried the tag) may be any catalog's, even with no other tag in the
    root yet (another catalog that wrote nothing since): deleted only when the operator says the
    roots are this catalog's alone (``clean_untagged``), and never where another tag is seen."""
    ours, untagged, shared = [], [], False
    for path, first in _harness_written(root):
        m = _TAGGED.match(first)
        if m is None:
            untagged.append(path)
        elif m.group(1) == tag:
            ours.append(path)
        else:
            shared = True
    if untagged and (shared or not clean_untagged):
        log.log(
            logging.WARNING if shared and clean_untagged else logging.INFO,
            "maintain: %d harness files under %s were named before names carried a catalog's "
            "tag: left (%s)",
            len(untagged),
            root,
            "another catalog writes into this root" if shared
            else "--clean-untagged deletes the unused ones where only this catalog writes",
        )  # fmt: skip
    deleted, now = [], time.time()
    for path in ours + (untagged if clean_untagged and not shared else []):
        if path in keep:
            continue
        try:
            if now - os.path.getmtime(path) < grace_s:
                continue
            os.remove(path)
        except FileNotFoundError:
            continue
        deleted.append(path)
    return deleted


def maintain_files(pinned: Sequence[Pinned], grace_s: float) -> dict[str, Any]:
    deleted: list[str] = []
    tag = next((p.catalog_tag for p in pinned if p.catalog_tag), "")
    untagged = any(p.clean_untagged for p in pinned)
    for root, keep in _referenced(pinned).items():
        deleted += _clean_root(root, keep, grace_s, tag, untagged)
    return {"deleted_files": deleted}


def _agree(
    first: Mapping[str, tuple[str, pa.DataType]],
    other: Mapping[str, tuple[str, pa.DataType]],
    columns: Sequence[ColumnSpec],
) -> bool:
    """A later file reads right beside the first through the table's name mapping: each of
    its physical names maps to the column it fills (a renamed column's old files, a column
    added since absent and so null), and its types widen to the harness's (Iceberg's
    per-file type promotion)."""
    ids = name_mapping(columns)
    by_name = {c.name: c for c in columns}
    for c, (name, have) in other.items():
        want = by_name[c]
        if ids.get(name) != want.field_id or not widens(have, want.arrow_type):
            return False
        if c in first and first[c][1] != have and not widens(first[c][1], want.arrow_type):
            return False
    return True
