"""CLI commands that talk to a running gateway through the Python client."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa

from clients import HarnessClient
from flight_gateway.cli.output import Progress, emit, table_text
from flight_gateway.protocol.errors import InvalidArgument


def _pem(path: str | None, flag: str) -> bytes | None:
    if not path:  # unset, or an empty environment variable
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise InvalidArgument(f"{flag}: cannot read {path!r}: {e.strerror or e}") from e


def tls_files(args: argparse.Namespace) -> tuple[bytes | None, bytes | None, bytes | None]:
    """(CA, client certificate, client key) from ``--tls-ca/--tls-cert/--tls-key`` (or their
    environment variables); refused rather than ignored where they cannot take effect."""
    ca = _pem(args.tls_ca, "--tls-ca")
    cert = _pem(args.tls_cert, "--tls-cert")
    key = _pem(args.tls_key, "--tls-key")
    if (cert is None) != (key is None):
        raise InvalidArgument("--tls-cert and --tls-key go together (mutual TLS)")
    if (ca or cert) and not args.uri.startswith("grpc+tls://"):
        raise InvalidArgument(
            f"--tls-ca/--tls-cert/--tls-key need a grpc+tls:// --uri, not {args.uri!r}"
        )
    return ca, cert, key


@contextmanager
def connect(args: argparse.Namespace) -> Iterator[HarnessClient]:
    ca, cert, key = tls_files(args)
    client = HarnessClient(
        args.uri, token=args.token, tls_root_certs=ca, tls_cert_chain=cert, tls_private_key=key
    )
    try:
        yield client
    finally:
        client.close()


def tables(args: argparse.Namespace) -> int:
    with connect(args) as c:
        names = c.list_tables()
    emit(names, args.json, "\n".join(names))
    return 0


def describe(args: argparse.Namespace) -> int:
    with connect(args) as c:
        info = c.action(
            "harness.describe", {"table": args.table, "version": args.version, "as_of": args.as_of}
        )
    fields = [{"name": f["name"], "type": f["type"], "id": f.get("id", "")} for f in info["schema"]]
    sources = [
        {"source": s["name"], "kind": s["kind"], "state": json.dumps(s["state"])}
        for s in info["sources"]
    ]
    text = (
        f"table {info['table']} at version {info['version']} (schema {info['schema_id']})\n"
        f"{table_text(fields, ['name', 'type', 'id'])}\n\n"
        f"{table_text(sources, ['source', 'kind', 'state'])}"
    )
    emit(info, args.json, text)
    return 0


def history(args: argparse.Namespace) -> int:
    with connect(args) as c:
        versions = c.action("harness.history", {"table": args.table, "limit": args.limit})[
            "versions"
        ]
    rows = [
        {
            "version": v["version"],
            "commit_id": v["commit_id"],
            "operation": v["summary"].get("operation", ""),
            "updated": ",".join(v["summary"].get("updated", [])),
        }
        for v in versions
    ]
    emit(versions, args.json, table_text(rows, ["version", "operation", "updated", "commit_id"]))
    return 0


class _Sink:
    """Writes batches in one output format to a file or stdout, incrementally."""

    def __init__(self, fmt: str, out: BinaryIO, schema: pa.Schema) -> None:
        self.fmt, self.out, self.schema = fmt, out, schema
        self.kept: list[pa.RecordBatch] = []
        self.writer: Any = None
        if fmt == "parquet":
            import pyarrow.parquet as pq

            self.writer = pq.ParquetWriter(out, schema)
        elif fmt == "csv":
            import pyarrow.csv as pcsv

            self.writer = pcsv.CSVWriter(out, schema)

    def write(self, batch: pa.RecordBatch) -> None:
        if self.writer is not None:
            self.writer.write(batch) if self.fmt == "csv" else self.writer.write_batch(batch)
        elif self.fmt == "json":
            for row in batch.to_pylist():
                self.out.write((json.dumps(row, default=str) + "\n").encode())
        else:
            self.kept.append(batch)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        elif self.fmt == "table":
            t = pa.Table.from_batches(self.kept, self.schema)
            self.out.write((table_text(t.to_pylist(), t.column_names) + "\n").encode())
        self.out.flush()


def read(args: argparse.Namespace) -> int:
    if args.format == "parquet" and not args.output:
        raise InvalidArgument("--format parquet needs --output FILE")
    columns = args.columns.split(",") if args.columns else None
    with connect(args) as c:
        info = c.flight_info(
            args.table, columns=columns, filter=args.filter, version=args.version, limit=args.limit
        )
        out: BinaryIO = open(args.output, "wb") if args.output else sys.stdout.buffer  # noqa: SIM115
        sink = _Sink(args.format, out, info.schema)
        progress = Progress(len(info.endpoints))
        remaining = args.limit
        try:
            for ep in info.endpoints:
                for batch in c.read_endpoint(ep):
                    if remaining is not None:
                        batch = batch.slice(0, max(remaining, 0))
                        remaining -= batch.num_rows
                    if batch.num_rows:
                        sink.write(batch)
                        progress.batch(batch.num_rows, batch.nbytes)
                progress.endpoint_done()
        finally:
            sink.close()
            progress.close()
            if args.output:
                out.close()
    return 0


def sql(args: argparse.Namespace) -> int:
    with connect(args) as c:
        result = c.sql(args.query)
    out: BinaryIO = open(args.output, "wb") if args.output else sys.stdout.buffer  # noqa: SIM115
    try:
        sink = _Sink(args.format, out, result.schema)
        for batch in result.to_batches():
            sink.write(batch)
        sink.close()
    finally:
        if args.output:
            out.close()
    return 0


def lock(args: argparse.Namespace) -> int:
    with connect(args) as c:
        grant = c.action(
            "harness.lock",
            {
                "table": args.table,
                "sources": args.sources,
                "owner": args.owner,
                "ttl_s": args.ttl,
                "wait_s": args.wait,
            },
        )
    text = f"lock {grant['lock_id']} fencing_token {grant['fencing_token']}"
    emit(grant, args.json, text)
    return 0


def unlock(args: argparse.Namespace) -> int:
    with connect(args) as c:
        c.unlock(args.lock_id)
    emit({"released": args.lock_id}, args.json, f"released {args.lock_id}")
    return 0


def locks(args: argparse.Namespace) -> int:
    with connect(args) as c:
        rows = c.list_locks(args.table)
    shown = [{**r, "sources": ",".join(r["sources"]), "lock_id": r["lock_id"] or "-"} for r in rows]
    cols = ["owner", "sources", "granted", "fencing_token", "expires_at", "lock_id"]
    emit(rows, args.json, table_text(shown, cols) if rows else "no locks")
    return 0


def commit(args: argparse.Namespace) -> int:
    try:
        body = json.loads(Path(args.file).read_text())
    except (OSError, ValueError) as e:
        raise InvalidArgument(f"cannot read commit file {args.file!r}: {e}") from e
    if not isinstance(body, dict):
        raise InvalidArgument("a commit file holds one JSON object")
    body.setdefault("table", args.table)
    # Put a commit_id in the file to make re-running the command safe (applied once).
    body.setdefault("commit_id", uuid.uuid4().hex)
    if not body.get("table"):
        raise InvalidArgument("the commit needs a table: give TABLE or 'table' in the file")
    with connect(args) as c:
        result = c.action("harness.commit", body)
    emit(result, args.json, f"version {result['version']} (applied: {result['applied']})")
    return 0


def expire(args: argparse.Namespace) -> int:
    if args.keep_last is None and args.before is None:
        raise InvalidArgument("give --keep-last N and/or --before TIMESTAMP")
    with connect(args) as c:
        n = c.expire_versions(args.table, keep_last=args.keep_last, before=args.before)
    emit({"expired": n}, args.json, f"expired {n} version(s)")
    return 0


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register the client commands; ``common`` carries --uri/--token/--json."""
    p = sub.add_parser("tables", parents=[common], help="list tables")
    p.set_defaults(func=tables)
    p = sub.add_parser("describe", parents=[common], help="a table at a version")
    p.add_argument("table")
    p.add_argument("--version", type=int)
    p.add_argument("--as-of", help="RFC 3339 timestamp or epoch seconds")
    p.set_defaults(func=describe)
    p = sub.add_parser("history", parents=[common], help="commits of a table, newest first")
    p.add_argument("table")
    p.add_argument("--limit", type=int)
    p.set_defaults(func=history)
    p = sub.add_parser("read", parents=[common], help="read a table at one pinned version")
    p.add_argument("table")
    p.add_argument("--columns", help="comma-separated column names")
    p.add_argument("--filter", help="SQL boolean expression, e.g. \"level = 'error'\"")
    p.add_argument("--version", type=int)
    p.add_argument("--limit", type=int)
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
    p.add_argument("--output", help="write to this file instead of standard output")
    p.set_defaults(func=read)
    p = sub.add_parser("sql", parents=[common], help="run a read-only SQL query (Flight SQL)")
    p.add_argument("query", help='e.g. "SELECT level, count(*) FROM logs GROUP BY level"')
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
    p.add_argument("--output", help="write to this file instead of standard output")
    p.set_defaults(func=sql)
    _lock_commands(sub, common)
    p = sub.add_parser("commit", parents=[common], help="commit the JSON body in FILE")
    p.add_argument("file")
    p.add_argument("table", nargs="?", help="table (else 'table' in the file)")
    p.set_defaults(func=commit)
    p = sub.add_parser("expire", parents=[common], help="forget old versions of a table")
    p.add_argument("table")
    p.add_argument("--keep-last", type=int)
    p.add_argument("--before", help="RFC 3339 timestamp or epoch seconds")
    p.set_defaults(func=expire)


def _lock_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("lock", parents=[common], help="lease a lock on sources of a table")
    p.add_argument("table")
    p.add_argument("sources", nargs="+")
    p.add_argument("--owner", default="cli")
    p.add_argument("--ttl", type=float, default=60.0, help="lease in seconds")
    p.add_argument("--wait", type=float, default=0.0, help="seconds to wait in the queue")
    p.set_defaults(func=lock)
    p = sub.add_parser("unlock", parents=[common], help="release a lock")
    p.add_argument("lock_id")
    p.set_defaults(func=unlock)
    p = sub.add_parser("locks", parents=[common], help="who holds or waits for locks on a table")
    p.add_argument("table")
    p.set_defaults(func=locks)
