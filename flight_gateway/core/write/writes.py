"""Engine writes (Spark): ``harness.begin_write`` / ``commit_write`` / ``abort_write``.

For a source whose kind ``AdoptsFiles`` the gateway hands out a staging location (mode
``stage``, created here, one directory per write); engine tasks write Parquet files into it, and
``commit_write`` adopts exactly the files of that write in one harness commit (``overwrite``
replaces the source's files; ``relocation`` marks a compaction, which adds no rows for
streaming readers). A compaction names the version it read (``read_version``): its files then
replace only what the source held at that version, and what writers added since stays (DESIGN
§18): it holds no lock while it reads and writes, only the commit's own lease of milliseconds.
A bin-pack compaction names the files it replaces (``replaces``); the others stay too.
``abort_write`` removes the directory. For an ``Appendable`` source the engine uploads its rows
with DoPut instead (mode ``upload``). Sources configs are resolved only here, never by clients.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import Mapping
from typing import Any

from flight_gateway.catalog import TableSnapshot
from flight_gateway.core.auth import Principal
from flight_gateway.core.context import Gateway
from flight_gateway.core.sources import bind
from flight_gateway.core.write.lease import leased
from flight_gateway.protocol import operations as ops
from flight_gateway.protocol.errors import Conflict, InvalidArgument
from planners.common import filesystem, local_file_problem, local_path
from planners.kind import AdoptsFiles, Appendable, RewritesFiles
from planners.registry import get_kind

log = logging.getLogger(__name__)
_WRITE_ID = re.compile(r"^[0-9a-f]{32}$")


def _target(snap: TableSnapshot, source: Any) -> str:
    """The named source, or the table's only source that accepts engine writes."""

    def accepts(kind_name: str) -> bool:
        kind = get_kind(kind_name)
        return isinstance(kind, (AdoptsFiles, Appendable))

    if source is not None:
        if not isinstance(source, str) or not source:
            raise InvalidArgument("'source' must be a source name")
        s = snap.source(source)
        if not accepts(s.kind):
            raise InvalidArgument(f"source {source!r} ({s.kind}) does not accept writes")
        return source
    candidates = [s.name for s in snap.sources if accepts(s.kind)]
    if len(candidates) != 1:
        raise InvalidArgument(
            f"name the 'source' to write to in table {snap.table!r} (candidates: {candidates})"
        )
    return candidates[0]


def _write_id(body: Mapping[str, Any]) -> str:
    write_id = body.get("write_id")
    if not isinstance(write_id, str) or not _WRITE_ID.fullmatch(write_id):
        raise InvalidArgument("'write_id' must be the id begin_write returned")
    return write_id


def _staged(gw: Gateway, write_id: str) -> str:
    """The name of a write's staging place: the catalog's tag first, so that a catalog's
    maintenance tells its own staged files from another's in a shared root (``spark-<tag>-``)."""
    return f"{gw.catalog.catalog_tag}-{write_id}"


def staging_places(gw: Gateway, kind: AdoptsFiles, ref: Any, write_id: str) -> tuple[str, ...]:
    """Where a write's files may be adopted from, each ending in "/": its staging location,
    and the one it had when begun before staging names carried the catalog's tag."""
    name = _staged(gw, write_id)
    tagged = kind.staging_location(ref, name).rstrip("/")
    if tagged.endswith(name):  # the name last, as the built-in kinds place it: no second call
        before = tagged[: -len(name)] + write_id  # (an Iceberg one loads the table)
    else:
        before = kind.staging_location(ref, write_id).rstrip("/")
    return tagged + "/", before + "/"


def _table(body: Mapping[str, Any]) -> str:
    t = body.get("table")
    if not isinstance(t, str) or not t:
        raise InvalidArgument("action body needs 'table'")
    return t


def begin_write(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("write", table)
    snap = gw.catalog.describe(table)
    source = _target(snap, body.get("source"))
    kind, ref = bind(gw, snap, source)
    write_id = uuid.uuid4().hex
    if not isinstance(kind, AdoptsFiles):
        return {"write_id": write_id, "source": source, "mode": "upload"}
    location = kind.staging_location(ref, _staged(gw, write_id))
    fs, path = filesystem(location)
    fs.create_dir(path, recursive=True)
    return {"write_id": write_id, "source": source, "mode": "stage", "location": location}


def _paths(body: Mapping[str, Any]) -> list[str]:
    # Required (the action table): a body that left it out committed no files, and with
    # ``overwrite`` emptied the source. An explicit [] still means "no files".
    paths = body["paths"]
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise InvalidArgument("'paths' must be a list of the files the write made")
    return paths


def _summary(body: Mapping[str, Any], paths: list[str]) -> dict[str, Any]:
    overwrite, relocation = bool(body.get("overwrite")), bool(body.get("relocation"))
    if relocation:
        return ops.relocation_summary(ops.COMPACTION, rows=body.get("rows"), file_count=len(paths))
    operation = ops.SPARK_OVERWRITE if overwrite else ops.SPARK_APPEND
    return {ops.OPERATION: operation, "rows": body.get("rows"), "file_count": len(paths)}


def _read_version(body: Mapping[str, Any]) -> int | None:
    """The version an optimistic rewrite read (``read_version``), or None."""
    version = body.get("read_version")
    if version is None:
        return None
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise InvalidArgument("'read_version' must be the table version the rewrite read")
    if not body.get("overwrite"):
        raise InvalidArgument("'read_version' is for rewrites: it needs 'overwrite'")
    return version


def _replaces(body: Mapping[str, Any]) -> list[str] | None:
    """The files a partial rewrite replaces (``replaces``), or None: all of them."""
    replaces = body.get("replaces")
    if replaces is None:
        return None
    if (
        not isinstance(replaces, list)
        or not replaces
        or not all(isinstance(p, str) and p for p in replaces)
    ):
        raise InvalidArgument("'replaces' must list the files the rewrite replaces")
    if body.get("read_version") is None:
        raise InvalidArgument("'replaces' is for rewrites: it needs 'read_version'")
    return list(dict.fromkeys(replaces))


def _rewrite(
    kind: AdoptsFiles,
    ref: Any,
    replaced: Mapping[str, Any],
    paths: list[str],
    commit_id: str,
    only: list[str] | None,
) -> dict[str, Any]:
    """DESIGN §18: the files replace what the source held at the version the rewrite read
    (``only``: those of its files), keeping what was added since; CONFLICT when what they
    replace is no longer current."""
    if isinstance(kind, RewritesFiles):
        if only is None:
            return kind.rewrite_files(ref, replaced, paths, commit_id=commit_id)
        return kind.rewrite_files(ref, replaced, paths, commit_id=commit_id, only=only)
    if only is not None:
        raise InvalidArgument(f"source {ref.name!r} ({ref.kind}) cannot replace some of its files")
    if dict(ref.state) != dict(replaced):  # a kind that cannot merge: nothing may come between
        raise Conflict(
            f"source {ref.name!r} changed since the rewrite read it: read the source again"
        )
    return kind.adopt_files(ref, paths, replace=True, commit_id=commit_id, relocation=True)


def _check_written(paths: list[str]) -> None:
    """INVALID_ARGUMENT unless every one of ``paths`` that is a local file exists and is a
    regular file: a commit adopting a name the engine never wrote, or a named pipe or a
    directory, would make every read of the new version fail (or hang, opening the pipe).
    Files in object stores are checked by their kind when it adopts them, through the
    source's own (guarded) file system: opening a caller's URI here would reach whatever
    endpoint its query string names before any allow-list ran."""
    local = [(p, local_path(p)) for p in paths]
    problems = [(p, local_file_problem(path)) for p, path in local if path is not None]
    missing = [p for p, why in problems if why == "missing"]
    if missing:
        raise InvalidArgument(
            f"{len(missing)} file(s) of the write do not exist (e.g. {missing[0]!r}): "
            "nothing was committed"
        )
    odd = [(p, why) for p, why in problems if why is not None]
    if odd:
        raise InvalidArgument(
            f"{len(odd)} path(s) of the write cannot be adopted (e.g. {odd[0][0]!r}: "
            f"{odd[0][1]}): nothing was committed"
        )


def _adopt(
    gw: Gateway, table: str, source: str, write_id: str, body: Mapping[str, Any], lock_id: str
) -> int:
    """Adopt exactly this write's files and commit the source's new state."""
    cat = gw.catalog
    paths = _paths(body)
    snap = cat.describe(table)
    kind, ref = bind(gw, snap, source)
    if not isinstance(kind, AdoptsFiles):
        raise InvalidArgument(f"source {source!r} ({ref.kind}) does not adopt files")
    places = staging_places(gw, kind, ref, write_id)
    outside = [p for p in paths
               if not p.startswith(places) or ".." in p or "?" in p or "#" in p]  # fmt: skip
    if outside:
        raise InvalidArgument(f"files {outside[:3]} are not in this write's location")
    _check_written(paths)
    commit_id = f"spark-write:{write_id}"
    read_version, only = _read_version(body), _replaces(body)
    if read_version is not None:
        replaced = cat.describe(table, version=read_version).source(source).state
        state = _rewrite(kind, ref, replaced, paths, commit_id, only)
    else:
        state = kind.adopt_files(
            ref,
            paths,
            replace=bool(body.get("overwrite")),
            commit_id=commit_id,
            relocation=bool(body.get("relocation")),
        )
    res = cat.commit(
        table,
        commit_id,
        lock_id=lock_id,
        fencing_token=body.get("fencing_token"),
        updates=[{"source": source, "state": state}],
        summary=_summary(body, paths),
    )
    log.info(
        "write %s into %s/%s: %d files -> v%d", write_id, table, source, len(paths), res.version
    )
    return res.version


def commit_write(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("write", table)
    cat = gw.catalog
    write_id = _write_id(body)
    done = cat.find_commit(table, f"spark-write:{write_id}")
    if done is not None:
        return {"version": done, "applied": False}
    source = _target(cat.describe(table), body.get("source"))
    held = body.get("lock_id")
    if held:  # under the caller's lock (a compaction job holds one)
        return {"version": _adopt(gw, table, source, write_id, body, str(held)), "applied": True}
    with leased(
        cat,
        table,
        [source],
        owner=f"write:{write_id}",
        ttl_s=gw.limits.write_lease_s,
        wait_s=120,
    ) as grant:
        return {
            "version": _adopt(gw, table, source, write_id, body, grant.lock_id),
            "applied": True,
        }


def abort_write(gw: Gateway, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
    table = _table(body)
    who.require("write", table)
    cat = gw.catalog
    write_id = _write_id(body)
    if cat.find_commit(table, f"spark-write:{write_id}") is not None:
        raise InvalidArgument(f"write {write_id} was committed; it cannot be aborted")
    snap = cat.describe(table)
    kind, ref = bind(gw, snap, _target(snap, body.get("source")))
    if isinstance(kind, AdoptsFiles):
        for place in staging_places(gw, kind, ref, write_id):
            fs, path = filesystem(place)
            with contextlib.suppress(FileNotFoundError):
                fs.delete_dir(path)
    return {}
