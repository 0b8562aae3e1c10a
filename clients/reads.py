"""Reads: plan (GetFlightInfo), fetch endpoints (DoGet, or direct tasks with C++ readers),
Arrow tables and batches, pandas/Polars/DuckDB adapters, Flight SQL statements."""

from __future__ import annotations

import contextvars
import json
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from clients.transport import Transport
from flight_gateway.protocol import ReadRequest
from flight_gateway.protocol.direct import DirectTask, verify_direct
from flight_gateway.protocol.flight_errors import from_flight_error
from flight_gateway.protocol.flightsql_command import statement
from flight_gateway.protocol.messages import parse_timestamp


class Reads(Transport):
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

    def sql(self, query: str) -> pa.Table:
        """Run a read-only SQL query over harness tables through the gateway's Flight SQL
        endpoint (DuckDB dialect; ``FROM t FOR VERSION AS OF n`` pins a table)."""
        command = fl.FlightDescriptor.for_command(statement(query))

        def call(uri: str) -> pa.Table:  # read-only: planned and fetched again on a failure
            flight = self._client(uri)
            info = flight.get_flight_info(command, self._options())
            parts = [flight.do_get(ep.ticket, self._options()).read_all() for ep in info.endpoints]
            return pa.concat_tables(parts) if parts else info.schema.empty_table()

        try:
            return self._replicas.run(call)
        except (fl.FlightError, pa.ArrowException, OSError) as e:
            raise from_flight_error(e) from e
