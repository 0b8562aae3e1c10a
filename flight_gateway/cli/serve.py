"""``harness-gateway serve``: run the Flight gateway until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time

from flight_gateway.app import GatewayConfig, HarnessFlightServer
from flight_gateway.catalog import Catalog
from flight_gateway.protocol.allocator import tune_for_flight

log = logging.getLogger("harness-gateway")


def serve(args: argparse.Namespace) -> int:
    tune_for_flight()  # first: a thread that allocates before the arena limit makes its own arena
    try:
        config = GatewayConfig.load(
            args.config,
            catalog=args.catalog,
            host=args.host,
            port=args.port,
            allow_anonymous=True if args.allow_anonymous else None,
        )
    except ValueError as e:  # ConfigError and every other check of the config: one line
        print(f"harness-gateway serve: {e}", file=sys.stderr)
        return 2
    if config.log_format == "json":
        json_logs()
    if not config.tokens and not config.allow_anonymous:
        log.error("no tokens configured: pass --config with tokens, or --allow-anonymous")
        return 2
    catalog = Catalog(config.catalog)
    try:
        server = HarnessFlightServer(catalog, config)
    except ValueError as e:  # a setting only the process can check (limits.kinds.<kind>)
        catalog.close()
        print(f"harness-gateway serve: {args.config or 'the config'}: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    thread = threading.Thread(target=server.serve, name="flight-serve", daemon=True)
    thread.start()
    log.info("serving on %s", server.uri)
    # Wake up regularly: Python runs signal handlers only between bytecodes of this thread.
    while not stop.wait(0.2) and thread.is_alive():
        pass
    server.shutdown()  # lets in-flight calls finish
    thread.join(30)
    catalog.close()
    log.info("shut down")
    return 0


def json_logs() -> None:
    """One JSON object per log line (for log shippers)."""
    handler = logging.StreamHandler()
    handler.setFormatter(_JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        trace_id = getattr(record, "trace_id", "")
        if trace_id:
            doc["trace_id"] = trace_id
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def maintain(args: argparse.Namespace) -> int:
    from flight_gateway.core.maintenance import run_once
    from flight_gateway.core.secrets import SecretResolver

    # The gateway config's secrets allow-list, when given (else the default HARNESS_SECRET_*).
    names = GatewayConfig.load(args.config).secret_names if args.config else None
    secrets = SecretResolver(names) if names is not None else SecretResolver()
    catalog = Catalog(args.catalog)
    try:
        while True:
            report = run_once(
                catalog, grace_s=args.grace, secrets=secrets, clean_untagged=args.clean_untagged
            )
            print(json.dumps(report.to_json()), flush=True)
            if not args.loop:
                return 0
            time.sleep(args.loop)
    finally:
        catalog.close()


def add_commands(sub: argparse._SubParsersAction, kinds: bool = True) -> None:
    p = sub.add_parser("serve", help="run the Flight gateway")
    p.add_argument("--catalog", help="catalog URL (sqlite:///file.db or postgresql://...)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--config", help="JSON or TOML settings file (tokens, ticket_key, tls, ...)")
    p.add_argument("--allow-anonymous", action="store_true", help="accept calls without a token")
    p.set_defaults(func=serve)
    p = sub.add_parser(
        "maintain", help="retention, file cleanup and Iceberg expiry that respect pinned versions"
    )
    p.add_argument("--catalog", required=True, help="catalog URL")
    p.add_argument("--config", help="the gateway config (its secrets allow-list)")
    p.add_argument("--loop", type=float, help="repeat every SECONDS (default: one pass)")
    p.add_argument(
        "--grace", type=float, default=3600.0, help="keep unreferenced files younger than this (s)"
    )
    p.add_argument(
        "--clean-untagged",
        action="store_true",
        help="the files roots are this catalog's alone: also delete unused files that a release "
        "before catalog tags wrote there",
    )
    p.set_defaults(func=maintain)
    if kinds:
        _kind_commands(sub)


def _kind_commands(sub: argparse._SubParsersAction) -> None:
    """Sub-commands contributed by source kinds (e.g. ``postgres enable-versioning``)."""
    from planners import registry
    from planners.kind import HasCommands

    for name in registry.available():
        try:
            kind = registry.get_kind(name)
        except Exception as e:  # a broken plugin must not break the CLI
            log.debug("source kind %s not loaded for the CLI: %s", name, e)
            continue
        if isinstance(kind, HasCommands):
            kind.add_commands(sub)
