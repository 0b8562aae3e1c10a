"""``files`` sources: an explicit list of Parquet / ORC / Arrow IPC / CSV files.

State ``{"files": [paths]}`` (relative to config ``root`` or absolute); exactly those files are
visible. Projection and the predicate go into a ``pyarrow.dataset`` scanner per file (row-group
statistics pruning for Parquet). Small files are grouped into one task up to ``target_task_bytes``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from flight_gateway.errors import InvalidArgument, Unavailable
from planners.base import (
    DEFAULT_BATCH_ROWS,
    ScanRequest,
    ScanTask,
    chain_readers,
    conform,
    group_by_size,
    physical_names,
    pushdown,
    target_schema,
)
from planners.predicates import to_arrow
from planners.scan import apply_residual

FORMATS = {
    "parquet": "parquet",
    "orc": "orc",
    "arrow": "ipc",
    "ipc": "ipc",
    "feather": "ipc",
    "csv": "csv",
}


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a local path or a URI (``file://``, ``s3://``, ...)."""
    if "://" in location:
        fs, path = pafs.FileSystem.from_uri(location)
        return fs, path
    return pafs.LocalFileSystem(), location


def resolve_paths(config: Mapping[str, Any], files: list[str]) -> tuple[pafs.FileSystem, list[str]]:
    fs, root = filesystem(str(config.get("root", "")))
    out = []
    for f in files:
        if not isinstance(f, str) or not f:
            raise InvalidArgument(f"file entries must be non-empty strings, got {f!r}")
        out.append(f if os.path.isabs(f) or not root else os.path.join(root, f))
    return fs, out


def file_format(config: Mapping[str, Any]) -> str:
    fmt = str(config.get("format", "parquet")).lower()
    if fmt not in FORMATS:
        raise InvalidArgument(f"unsupported files format {fmt!r} (supported: {sorted(FORMATS)})")
    return FORMATS[fmt]


class FilesPlanner:
    def plan(self, request: ScanRequest) -> list[ScanTask]:
        src = request.source
        file_format(src.config)
        files = list(src.state.get("files", []))
        fs, paths = resolve_paths(src.config, files)
        infos = fs.get_file_info(paths) if paths else []
        for info in infos:
            if info.type == pafs.FileType.NotFound:
                raise Unavailable(f"source {src.name!r}: file {info.path!r} is missing")
        target = src.config.get("target_task_bytes")
        groups = group_by_size(
            [(name, info.size) for name, info in zip(files, infos, strict=True)],
            int(target) if target else None,
        )
        return [ScanTask(src.name, src.kind, {"files": g}, exact_filter=True) for g in groups]

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        src = request.source
        fmt = file_format(src.config)
        fs, paths = resolve_paths(src.config, list(task.payload["files"]))
        cols = request.columns

        def one(path: str) -> pa.RecordBatchReader:
            try:
                dataset = ds.dataset(path, format=fmt, filesystem=fs)
            except (FileNotFoundError, OSError) as e:
                raise Unavailable(f"source {src.name!r}: cannot open {path!r}: {e}") from e
            mapping = physical_names(cols, dataset.schema.names)
            pred = pushdown(request, mapping)
            scanner = dataset.scanner(
                columns=sorted(set(mapping.values())),
                filter=to_arrow(pred, dataset.schema) if pred is not None else None,
                batch_size=DEFAULT_BATCH_ROWS,
                use_threads=True,
            )
            if request.predicate is not None and pred is None:
                # The predicate names a column this file lacks: evaluate it after conforming.
                return apply_residual(
                    conform(scanner.to_reader(), cols, mapping), request.predicate
                )
            return conform(scanner.to_reader(), cols, mapping)

        if len(paths) == 1:
            return one(paths[0])

        def readers() -> Iterator[pa.RecordBatchReader]:
            for p in paths:
                yield one(p)

        return chain_readers(target_schema(cols), readers())
