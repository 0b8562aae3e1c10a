"""Writes and administration: DoPut, commits, tables and sources, schema changes, locks
(``HeldLock``), versions and engine writes, as typed wrappers of the ``harness.*`` actions."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from clients.transport import Transport
from flight_gateway.protocol import CommitRecord, TableInfo
from flight_gateway.protocol.flight_errors import from_flight_error

log = logging.getLogger(__name__)


class Admin(Transport):
    def put(
        self,
        table: str,
        data: pa.Table,
        *,
        commit_id: str | None = None,
        source: str | None = None,
        merge: bool = False,
    ) -> dict[str, Any]:
        """Upload rows (DoPut): routed by partition values (or to ``source``), one commit.
        Pass the same ``commit_id`` when retrying after an error: it never writes twice.
        ``merge``: rows upsert by the table's primary key, or delete it where a ``_op`` column
        says ``'delete'``; the last operation per key in the upload wins."""
        cmd: dict[str, Any] = {
            "table": table,
            "commit_id": commit_id or uuid.uuid4().hex,
            "rows": data.num_rows,  # the gateway commits nothing unless all of them arrived
        }
        if source is not None:
            cmd["source"] = source
        if merge:
            cmd["mode"] = "merge"
        descriptor = fl.FlightDescriptor.for_command(json.dumps(cmd).encode())

        def call(uri: str) -> Any:  # repeated with the same commit id: applied at most once
            writer, reply = self._client(uri).do_put(descriptor, data.schema, self._options())
            writer.write_table(data)
            writer.done_writing()
            buf = reply.read()
            writer.close()
            return buf

        try:
            buf = self._replicas.run(call)
        except (fl.FlightError, pa.ArrowException, OSError) as e:
            raise from_flight_error(e) from e
        return dict(json.loads(buf.to_pybytes())) if buf is not None else {}

    # ------------------------------------------------------------------ actions

    def list_tables(self) -> list[str]:
        return list(self.action("harness.list_tables")["tables"])

    def create_table(
        self,
        table: str,
        schema: pa.Schema | Sequence[Mapping[str, Any]],
        *,
        partition_by: Sequence[str] = (),
        primary_key: Sequence[str] = (),
        properties: Mapping[str, Any] | None = None,
        commit_id: str | None = None,
    ) -> int:
        """Create ``table`` (version 0). ``commit_id``: the creation's id, so sending the same
        create again (after a lost answer) is not ALREADY_EXISTS."""
        body: dict[str, Any] = {
            "table": table,
            "partition_by": list(partition_by),
            "primary_key": list(primary_key),
        }
        if commit_id is not None:
            body["commit_id"] = commit_id
        if isinstance(schema, pa.Schema):
            body["schema"] = [
                {"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema
            ]
        else:
            body["schema"] = list(schema)
        if properties:
            body["properties"] = dict(properties)
        return int(self.action("harness.create_table", body)["version"])

    def drop_table(self, table: str) -> None:
        self.action("harness.drop_table", {"table": table})

    def describe(self, table: str, version: int | None = None, as_of: Any = None) -> TableInfo:
        """The table at a version: schema, sources with their states, properties, ..."""
        body = {"table": table, "version": version, "as_of": as_of}
        return TableInfo.from_json(self.action("harness.describe", body))

    def history(self, table: str, limit: int | None = None) -> list[CommitRecord]:
        """Commits, newest first."""
        versions = self.action("harness.history", {"table": table, "limit": limit})["versions"]
        return [CommitRecord.from_json(v) for v in versions]

    def commit(
        self,
        table: str,
        *,
        commit_id: str | None = None,
        lock: HeldLock | None = None,
        **changes: Any,
    ) -> int:
        """Commit ``add_sources``/``remove_sources``/``updates``/``external_state``/... at once."""
        body = {"table": table, "commit_id": commit_id or uuid.uuid4().hex, **changes}
        if lock is not None:
            body["lock_id"], body["fencing_token"] = lock.lock_id, lock.fencing_token
        return int(self.action("harness.commit", body)["version"])

    def add_source(
        self,
        table: str,
        name: str,
        kind: str,
        *,
        config: Mapping[str, Any] | None = None,
        partition: Mapping[str, Any] | None = None,
        state: Mapping[str, Any] | None = None,
        commit_id: str | None = None,
    ) -> int:
        spec = {
            "name": name,
            "kind": kind,
            "config": dict(config or {}),
            "partition": dict(partition or {}),
            "state": dict(state or {}),
        }
        return self.commit(table, commit_id=commit_id, add_sources=[spec])

    def evolve_schema(
        self, table: str, changes: Sequence[Mapping[str, Any]], *, commit_id: str | None = None
    ) -> int:
        body = {
            "table": table,
            "commit_id": commit_id or uuid.uuid4().hex,
            "changes": list(changes),
        }
        return int(self.action("harness.evolve_schema", body)["version"])

    def lock(
        self,
        table: str,
        sources: Sequence[str],
        *,
        owner: str = "client",
        ttl_s: float = 30,
        wait_s: float = 0,
    ) -> HeldLock:
        """Acquire a lock; use as a context manager to renew it in the background and release."""
        res = self.action(
            "harness.lock",
            {
                "table": table,
                "sources": list(sources),
                "owner": owner,
                "ttl_s": ttl_s,
                "wait_s": wait_s,
            },
        )
        return HeldLock(
            self, table, res["lock_id"], int(res["fencing_token"]), float(res["expires_at"]), ttl_s
        )

    def renew_lock(self, lock_id: str, ttl_s: float | None = None) -> float:
        return float(
            self.action("harness.renew_lock", {"lock_id": lock_id, "ttl_s": ttl_s})["expires_at"]
        )

    def unlock(self, lock_id: str) -> None:
        self.action("harness.unlock", {"lock_id": lock_id})

    # ------------------------------------------------------------------ engine writes

    def list_locks(self, table: str) -> list[dict[str, Any]]:
        """Granted and queued locks of ``table`` (lock ids only for their owner and admins)."""
        return list(self.action("harness.list_locks", {"table": table})["locks"])

    def expire_versions(
        self, table: str, *, keep_last: int | None = None, before: Any = None
    ) -> int:
        """Forget old versions (admin); returns how many expired."""
        body = {"table": table, "keep_last": keep_last, "before": before}
        return int(self.action("harness.expire_versions", body)["expired"])

    def begin_write(self, table: str, source: str | None = None) -> dict[str, Any]:
        """Start an engine write: ``{"write_id", "source", "mode": "stage", "location"}`` (write
        Parquet files under ``location``, then ``commit_write``) or ``mode: "upload"`` (send the
        rows with ``put``)."""
        return self.action("harness.begin_write", {"table": table, "source": source})

    def commit_write(
        self,
        table: str,
        write_id: str,
        files: Sequence[str],
        *,
        source: str | None = None,
        overwrite: bool = False,
        relocation: bool = False,
        rows: int | None = None,
        lock: HeldLock | None = None,
        read_version: int | None = None,
        replaces: Sequence[str] | None = None,
    ) -> int:
        """Publish the files of a ``stage``-mode write in one commit (``relocation``: a
        compaction that rewrites rows and adds none; ``lock``: commit under a lock the caller
        holds on the source; ``read_version`` with ``overwrite``: the files replace what the
        source held at that version, what was added since stays, CONFLICT when what they
        replace was replaced or deleted from since; ``replaces`` with ``read_version``: only
        those of its files, as direct tasks name them, are replaced)."""
        body: dict[str, Any] = {"table": table, "write_id": write_id, "source": source}
        body.update({"paths": list(files), "overwrite": overwrite, "relocation": relocation})
        body["rows"] = rows
        if read_version is not None:
            body["read_version"] = read_version
        if replaces is not None:
            body["replaces"] = list(replaces)
        if lock is not None:
            body["lock_id"], body["fencing_token"] = lock.lock_id, lock.fencing_token
        return int(self.action("harness.commit_write", body)["version"])

    def move(
        self,
        table: str,
        hot: str,
        cold: str,
        *,
        where: str | None = None,
        mode: str = "auto",
        staged: Mapping[str, Any] | None = None,
        wait_s: float = 120.0,
    ) -> dict[str, Any]:
        """Move the rows of source ``hot`` (those matching ``where``, a filter, when given) into
        source ``cold`` in one commit, in the gateway (``harness.move``, docs/protocol.md):
        ``{"version": v or None when nothing moved, "rows": n, "applied": ...}``. ``mode``:
        ``append``, ``merge`` (by the table's primary key) or ``auto``. ``staged``: an engine
        wrote the rows (``{"write_id", "paths", "version"}``, see ``begin_write``)."""
        body: dict[str, Any] = {"table": table, "hot": hot, "cold": cold, "mode": mode}
        body["wait_s"] = wait_s
        if where is not None:
            body["where"] = where
        if staged is not None:
            body["staged"] = dict(staged)
        return self.action("harness.move", body)

    def abort_write(self, table: str, write_id: str, source: str | None = None) -> None:
        """Remove the files of an unfinished ``stage``-mode write."""
        self.action("harness.abort_write", {"table": table, "write_id": write_id, "source": source})


class HeldLock:
    """A granted lock. As a context manager it renews at a third of its TTL and releases."""

    def __init__(
        self,
        client: Admin,
        table: str,
        lock_id: str,
        fencing_token: int,
        expires_at: float,
        ttl_s: float,
    ) -> None:
        self.client, self.table, self.lock_id = client, table, lock_id
        self.fencing_token, self.expires_at, self.ttl_s = fencing_token, expires_at, ttl_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.renew_error: Exception | None = None

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.expires_at = self.client.renew_lock(self.lock_id, self.ttl_s)
            except Exception as e:  # the commit will fail with LockExpired; keep the reason
                log.warning("lock %s: renewal failed: %s", self.lock_id, e)
                self.renew_error = e
                return

    def __enter__(self) -> HeldLock:
        self._thread = threading.Thread(
            target=self._renew_loop, daemon=True, name=f"renew-{self.lock_id[:8]}"
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.client.unlock(self.lock_id)
