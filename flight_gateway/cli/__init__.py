"""``harness-gateway``: one command line for operators and users.

Server side: ``serve``, ``maintain``, and the sub-commands source kinds add (e.g.
``postgres enable-versioning``). Client side (a running gateway, ``--uri``/``HARNESS_URI`` and
``--token``/``HARNESS_TOKEN``; ``--json`` for scripts): ``tables``, ``describe``, ``history``,
``read``, ``lock``/``unlock``/``locks``, ``commit``, ``expire``, ``apply``.
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
    common.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    return common


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="harness-gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--log-level", default="WARNING")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.add_commands(sub)
    common = _common()
    client_cmds.add_commands(sub, common)
    apply.add_commands(sub, common)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
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
