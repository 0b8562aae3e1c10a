"""``harness-gateway`` command line."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from flight_gateway.catalog import Catalog
from flight_gateway.server import GatewayConfig, HarnessFlightServer

log = logging.getLogger("harness-gateway")


def serve(args: argparse.Namespace) -> int:
    config = GatewayConfig.load(
        args.config,
        catalog=args.catalog,
        host=args.host,
        port=args.port,
        allow_anonymous=True if args.allow_anonymous else None,
    )
    if not config.tokens and not config.allow_anonymous:
        log.error("no tokens configured: pass --config with tokens, or --allow-anonymous")
        return 2
    catalog = Catalog(config.catalog)
    server = HarnessFlightServer(catalog, config)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness-gateway")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run the Flight gateway")
    p.add_argument("--catalog", help="catalog URL (sqlite:///file.db or postgresql://...)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--config", help="JSON or TOML settings file (tokens, ticket_key, tls, ...)")
    p.add_argument("--allow-anonymous", action="store_true", help="accept calls without a token")
    p.set_defaults(func=serve)
    _kind_commands(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return int(args.func(args))


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


if __name__ == "__main__":
    sys.exit(main())
