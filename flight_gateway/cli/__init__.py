"""``harness-gateway``: one command line for operators and users.

Server side: ``serve``, ``maintain``, and the sub-commands source kinds add (e.g.
``postgres enable-versioning``). Client side (a running gateway, ``--uri``/``HARNESS_URI``,
``--token``/``HARNESS_TOKEN``, and for TLS ``--tls-ca``/``HARNESS_TLS_CA``,
``--tls-cert``/``HARNESS_TLS_CERT`` and ``--tls-key``/``HARNESS_TLS_KEY``; ``--json`` for
scripts): ``tables``, ``describe``, ``history``, ``read``, ``lock``/``unlock``/``locks``,
``commit``, ``expire``, ``apply``.
Errors print one line on stderr and exit with status 1 (2 for usage errors).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import pyarrow as pa
import pyarrow.flight as fl

from flight_gateway.cli import apply, client_cmds, serve
from flight_gateway.protocol.errors import HarnessError

__all__ = ["main"]


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--uri",
        default=os.environ.get("HARNESS_URI", "grpc://127.0.0.1:8815"),
        help="gateway URI (env HARNESS_URI)",
    )
    common.add_argument(
        "--token", default=os.environ.get("HARNESS_TOKEN"), help="bearer token (env HARNESS_TOKEN)"
    )
    # A gateway whose certificate a private CA signed, or that requires client certificates
    # (mutual TLS), cannot be reached with the system's roots alone.
    tls = [
        ("--tls-ca", "HARNESS_TLS_CA", "PEM file of the CA that signed the gateway's certificate"),
        ("--tls-cert", "HARNESS_TLS_CERT", "PEM file of this client's certificate (mutual TLS)"),
        ("--tls-key", "HARNESS_TLS_KEY", "PEM file of the private key of --tls-cert"),
    ]
    for flag, env, text in tls:
        common.add_argument(
            flag, default=os.environ.get(env), metavar="FILE", help=f"{text} (env {env})"
        )
    common.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    return common


def parser(kinds: bool = True) -> argparse.ArgumentParser:
    """The command line; with the sub-commands source kinds add when ``kinds``."""
    p = argparse.ArgumentParser(prog="harness-gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--log-level", default="WARNING")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.add_commands(sub, kinds=kinds)
    common = _common()
    client_cmds.add_commands(sub, common)
    apply.add_commands(sub, common)
    return p


def parser_for(argv: list[str]) -> argparse.ArgumentParser:
    """The parser ``argv`` needs: the kinds' sub-commands only when it does not name one of the
    gateway's own commands (or asks for the list). Adding them loads every kind's module and
    what it imports: ~0.5 s of CPU in each ``serve`` start, which a replica restarted under
    load took from the replica serving its writers (most kinds are never used by a catalog)."""
    own = parser(kinds=False)
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--log-level")
    first.add_argument("command", nargs="?")
    command = first.parse_known_args(argv)[0].command
    return own if command in _commands(own) else parser()


def _commands(p: argparse.ArgumentParser) -> set[str]:
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return {name for action in subs for name in action.choices}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser_for(argv).parse_args(argv)
    level = (
        "INFO" if args.command in ("serve", "maintain") and args.log_level == "WARNING" else None
    )
    logging.basicConfig(
        level=(level or args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except HarnessError as e:
        print(f"harness-gateway {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except (fl.FlightError, pa.ArrowException, OSError) as e:
        print(f"harness-gateway {args.command}: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `read ... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
