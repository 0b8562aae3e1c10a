"""``HarnessClient``: reads as Arrow (pandas/Polars/DuckDB adapters), typed action wrappers."""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from clients.failover import IDEMPOTENT_ACTIONS, Replicas
from flight_gateway.allocator import tune_for_flight
from flight_gateway.protocol import (
    CommitRecord,
    ReadRequest,
    TableInfo,
    from_flight_error,
)
from flight_gateway.protocol.direct import DirectTask, verify_direct
from flight_gateway.protocol.messages import parse_timestamp
from flight_gateway.tracing import current_traceparent

log = logging.getLogger(__name__)

#: gRPC hands Flight message bodies over zero-copy at whatever offset the protobuf framing puts
#: them, so value buffers are often not aligned to their type's width (Acero then warns "An input
#: buffer was poorly aligned" when the table is scanned, e.g. by DuckDB). The IPC reader copies
#: only the buffers that are misaligned, once, as the batches are decoded.
_READ_OPTIONS = pa.ipc.IpcReadOptions(ensure_alignment=pa.ipc.Alignment.DataTypeSpecific)


class HarnessClient:
    """Client of one gateway (``grpc://host:port``); endpoints on other replicas are followed."""

    def __init__(
        self,
        uri: str,
        token: str | None = None,
        *,
        max_workers: int = 8,
        tls_root_certs: bytes | None = None,
        timeout_s: float | None = None,
        tls_cert_chain: bytes | None = None,
        tls_private_key: bytes | None = None,
        replicas: Sequence[str] = (),
        failover_s: float | None = None,
        traceparent: str | None = None,
        busy_wait_s: float = 30.0,
    ) -> None:
        """``tls_root_certs`` verifies the gateway; ``tls_cert_chain``/``tls_private_key`` are
        this client's certificate when the gateway requires mutual TLS. ``replicas``: other
        gateways on the same catalog; calls that are safe to repeat move to the next one when
        a gateway cannot be reached, for up to ``failover_s`` (default 60 s with replicas, 0
        without: fail at once), so also across a restart (``clients.failover``). A call a
        gateway refused because a concurrency limit was full (``errors.Busy``) is repeated
        with a back-off for up to ``busy_wait_s`` (0: raise at once)."""
        self.uri = uri
        #: A W3C trace parent to send (else the current OpenTelemetry span's, if any).
        self._traceparent = traceparent
        # gRPC's message buffers (flight_gateway.allocator): process-wide, so opt-in here.
        tune_for_flight(default_on=False)
        window = failover_s if failover_s is not None else (60.0 if replicas else 0.0)
        self._replicas = Replicas([uri, *replicas], window, busy_wait_s)
        self._headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._tls: dict[str, bytes] = {}
        if tls_root_certs:
            self._tls["tls_root_certs"] = tls_root_certs
        if tls_cert_chain and tls_private_key:
            self._tls.update(cert_chain=tls_cert_chain, private_key=tls_private_key)
        self._timeout = timeout_s
        self._max_workers = max_workers
        self._clients: dict[str, fl.FlightClient] = {}
        self._public_key: str | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ plumbing

    def _client(self, uri: str) -> fl.FlightClient:
        with self._lock:
            c = self._clients.get(uri)
            if c is None:
                c = fl.FlightClient(uri, **self._tls)
                self._clients[uri] = c
            return c

    def _options(self) -> fl.FlightCallOptions:
        headers = self._headers
        parent = self._traceparent or current_traceparent()
        if parent:  # the gateway's spans join the caller's trace
            headers = [*headers, (b"traceparent", parent.encode())]
        return fl.FlightCallOptions(
            headers=headers, timeout=self._timeout, read_options=_READ_OPTIONS
        )

    def close(self) -> None:
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()

    def __enter__(self) -> HarnessClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def action(self, name: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run a ``harness.*`` action and return its JSON result."""
        payload = fl.Action(name, json.dumps(body or {}).encode())

        def call(uri: str) -> list[Any]:
            return list(self._client(uri).do_action(payload, self._options()))

        try:
            results = self._replicas.run(call, unsent_only=name not in IDEMPOTENT_ACTIONS)
        except (fl.FlightError, pa.ArrowException, OSError) as e:
            raise from_flight_error(e) from e
        return json.loads(results[0].body.to_pybytes()) if results else {}

    # ------------------------------------------------------------------ reads

    @staticmethod
    def _descriptor(
        table: str,
        *,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        version: int | None = None,
        as_of: Any = None,
        limit: int | None = None,
        dedupe: bool = False,
        sources: Sequence[str] | None = None,
        since: int | None = None,
        direct: bool = False,
    ) -> fl.FlightDescriptor:
        request = ReadRequest(
            table=table,
            columns=tuple(columns) if columns is not None else None,
            filter=filter,
            version=version,
            as_of=parse_timestamp(as_of, "as_of"),
            limit=limit,
            dedupe=dedupe,
            sources=tuple(sources) if sources is not None else None,
            since=since,
            direct=direct,
        )
        return fl.FlightDescriptor.for_command(request.to_json().encode())

    def flight_info(
        self,
        table: str,
        *,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        version: int | None = None,
        as_of: Any = None,
        limit: int | None = None,
        dedupe: bool = False,
        sources: Sequence[str] | None = None,
        since: int | None = None,
        direct: bool = False,
    ) -> fl.FlightInfo:
        """Plan a read; ``sources`` (extension) restricts it to those sources, ``since``
        (extension) to rows added after that version, ``direct`` (extension) asks for direct
        tasks where sources allow them."""
        fields = {"columns": columns, "filter": filter, "version": version, "as_of": as_of}
        fields.update({"limit": limit, "dedupe": dedupe, "sources": sources, "since": since})
        fields["direct"] = direct
        descriptor = self._descriptor(table, **fields)
        try:
            return self._replicas.run(
                lambda uri: self._client(uri).get_flight_info(descriptor, self._options())
            )
        except (fl.FlightError, pa.ArrowException, OSError) as e:
            raise from_flight_error(e) from e

    def schema(
        self, table: str, *, columns: Sequence[str] | None = None, version: int | None = None
    ) -> pa.Schema:
        descriptor = self._descriptor(table, columns=columns, version=version)
        try:
            return self._replicas.run(
                lambda uri: self._client(uri).get_schema(descriptor, self._options()).schema
            )
        except (fl.FlightError, pa.ArrowException, OSError) as e:
            raise from_flight_error(e) from e

    @staticmethod
    def _locations(ep: fl.FlightEndpoint) -> list[str]:
        """The endpoint's own gateway addresses (none: the one that planned it, or any)."""
        out = []
        for loc in ep.locations:
            uri = loc.uri.decode() if isinstance(loc.uri, bytes) else str(loc.uri)
            if uri and not uri.startswith("arrow-flight-reuse-connection"):
                out.append(uri)
        return out

    def read_endpoint(self, ep: fl.FlightEndpoint) -> pa.RecordBatchReader:
        """A stream of the endpoint's batches. Opening it moves to another replica when one is
        unreachable; a stream cut later raises (``read`` and ``read_batches`` with replicas
        fetch the endpoint again instead)."""
        try:
            return self._replicas.run(
                lambda uri: self._client(uri).do_get(ep.ticket, self._options()).to_reader(),
                prefer=self._locations(ep),
                unsent_only=True,
            )
        except (fl.FlightError, pa.ArrowException, OSError) as e:
            raise from_flight_error(e) from e

    @property
    def public_key(self) -> str:
        """The gateway's key for verifying direct tasks (fetched once)."""
        if self._public_key is None:
            self._public_key = str(self.action("harness.public_key")["public_key"])
        return self._public_key

    def direct_task(self, ep: fl.FlightEndpoint) -> DirectTask | None:
        """The endpoint's direct task, verified (signature, expiry), or None when it has none."""
        if not ep.app_metadata:
            return None
        token = json.loads(ep.app_metadata).get("direct")
        return verify_direct(token, self.public_key) if token else None

    def _read_endpoint_all(self, ep: fl.FlightEndpoint) -> pa.Table:
        task = self.direct_task(ep)
        if task is not None:
            from clients.direct import run

            return run(task)
        return self.fetch_endpoint(ep)

    @property
    def has_replicas(self) -> bool:
        return len(self._replicas.uris) > 1

    def fetch_endpoint(self, ep: fl.FlightEndpoint) -> pa.Table:
        """The whole endpoint; a stream cut mid-way is fetched again from its start (on another
        replica if need be) and the partial rows are dropped."""
        try:
            return self._replicas.run(
                lambda uri: self._client(uri).do_get(ep.ticket, self._options()).read_all(),
                prefer=self._locations(ep),
            )
        except (fl.FlightError, pa.ArrowException, OSError) as e:
            raise from_flight_error(e) from e

    def read(
        self,
        table: str,
        *,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        version: int | None = None,
        as_of: Any = None,
        limit: int | None = None,
        dedupe: bool = False,
        sources: Sequence[str] | None = None,
        direct: bool = False,
    ) -> pa.Table:
        """The rows of ``table`` at one pinned version, endpoints fetched in parallel. With
        ``direct``, files of sources that allow it are read here (C++ readers) instead of
        through the gateway; the rows are the same."""
        info = self.flight_info(
            table,
            columns=columns,
            filter=filter,
            version=version,
            as_of=as_of,
            limit=limit,
            dedupe=dedupe,
            sources=sources,
            direct=direct,
        )
        endpoints = list(info.endpoints)
        if len(endpoints) <= 1:
            parts = [self._read_endpoint_all(ep) for ep in endpoints]
        else:
            with ThreadPoolExecutor(min(self._max_workers, len(endpoints))) as pool:
                # Each task runs in a copy of the caller's context: its trace (traceparent)
                # and anything else a contextvar carries follow the endpoint reads.
                futures = [
                    pool.submit(contextvars.copy_context().run, self._read_endpoint_all, ep)
                    for ep in endpoints
                ]
                parts = [f.result() for f in futures]
        result = pa.concat_tables(parts) if parts else info.schema.empty_table()
        if limit is not None and result.num_rows > limit:
            result = result.slice(0, limit)
        return result

    def read_batches(self, table: str, **kwargs: Any) -> Iterator[pa.RecordBatch]:
        """Stream batches endpoint by endpoint (bounded memory). With ``replicas``, each
        endpoint is read whole before its batches are yielded, so a stream cut by a dying
        gateway is fetched again without repeating rows (memory: one endpoint)."""
        limit = kwargs.get("limit")
        info = self.flight_info(table, **kwargs)
        remaining = limit
        for ep in info.endpoints:
            if self.has_replicas:
                batches: Iterator[pa.RecordBatch] = iter(self.fetch_endpoint(ep).to_batches())
            else:
                batches = iter(self.read_endpoint(ep))
            for batch in batches:
                if remaining is not None:
                    if remaining <= 0:
                        return
                    batch = batch.slice(0, remaining)
                    remaining -= batch.num_rows
                yield batch

    def pinned_version(self, info: fl.FlightInfo) -> int:
        return int(json.loads(info.app_metadata)["version"])

    def to_pandas(self, table: str, **kwargs: Any) -> Any:
        return self.read(table, **kwargs).to_pandas()

    def to_polars(self, table: str, **kwargs: Any) -> Any:
        import polars as pl

        return pl.from_arrow(self.read(table, **kwargs))

    def to_duckdb(self, table: str, connection: Any = None, **kwargs: Any) -> Any:
        """A DuckDB relation over the read (``connection`` defaults to DuckDB's default)."""
        import duckdb

        data = self.read(table, **kwargs)
        con = connection if connection is not None else duckdb.default_connection()
        return con.from_arrow(data)

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
        cmd: dict[str, Any] = {"table": table, "commit_id": commit_id or uuid.uuid4().hex}
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
    ) -> int:
        body: dict[str, Any] = {
            "table": table,
            "partition_by": list(partition_by),
            "primary_key": list(primary_key),
        }
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

    def sql(self, query: str) -> pa.Table:
        """Run a read-only SQL query over harness tables through the gateway's Flight SQL
        endpoint (DuckDB dialect; ``FROM t FOR VERSION AS OF n`` pins a table)."""
        from flight_gateway.flightsql.service import pack, pb

        command = fl.FlightDescriptor.for_command(pack(pb.CommandStatementQuery(query=query)))

        def call(uri: str) -> pa.Table:  # read-only: planned and fetched again on a failure
            flight = self._client(uri)
            info = flight.get_flight_info(command, self._options())
            parts = [flight.do_get(ep.ticket, self._options()).read_all() for ep in info.endpoints]
            return pa.concat_tables(parts) if parts else info.schema.empty_table()

        try:
            return self._replicas.run(call)
        except (fl.FlightError, pa.ArrowException, OSError) as e:
            raise from_flight_error(e) from e

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
    ) -> int:
        """Publish the files of a ``stage``-mode write in one commit (``relocation``: a
        compaction that rewrites rows and adds none; ``lock``: commit under a lock the caller
        holds on the source)."""
        body: dict[str, Any] = {"table": table, "write_id": write_id, "source": source}
        body.update({"paths": list(files), "overwrite": overwrite, "relocation": relocation})
        body["rows"] = rows
        if lock is not None:
            body["lock_id"], body["fencing_token"] = lock.lock_id, lock.fencing_token
        return int(self.action("harness.commit_write", body)["version"])

    def abort_write(self, table: str, write_id: str, source: str | None = None) -> None:
        """Remove the files of an unfinished ``stage``-mode write."""
        self.action("harness.abort_write", {"table": table, "write_id": write_id, "source": source})


class HeldLock:
    """A granted lock. As a context manager it renews at a third of its TTL and releases."""

    def __init__(
        self,
        client: HarnessClient,
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
