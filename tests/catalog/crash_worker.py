"""A process that commits from many threads until it is killed (see ``test_crash``).

python -m tests.catalog.crash_worker URL WRITERS [DIE_AFTER_STATE_INSERTS]

Writer ``w`` owns sources ``a{w}`` and ``b{w}``; its i-th commit sets both to ``{"n": i}`` and
``external_state[w{w}] = i``, so a half-applied commit would show them disagreeing. With
``DIE_AFTER_STATE_INSERTS`` the process SIGKILLs itself right after the catalog transaction
that applies a group sent that many state inserts, before that transaction ends. On Postgres a
group is one call of the commit function (one statement, so there is no "between statements"):
there the process dies while its DIE_AFTER_STATE_INSERTS-th call is in flight.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from sqlalchemy import event

from flight_gateway.catalog import Catalog


def _die_after(cat: Catalog, n: int) -> None:
    seen = {"n": 0}

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO HARNESS_SOURCE_STATES"):
            seen["n"] += 1
            if seen["n"] >= n:
                sys.stdout.write("DYING\n")
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    event.listen(cat.engine, "after_cursor_execute", after)

    def in_flight(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "harness_commit_group" in statement:
            seen["n"] += 1
            if seen["n"] >= n:
                sys.stdout.write("DYING\n")
                sys.stdout.flush()
                threading.Thread(target=_kill_soon, daemon=True).start()

    fast = cat._commits._fast  # the one-statement commit engine (Postgres only)
    if fast is not None:
        event.listen(fast, "before_cursor_execute", in_flight)


def _kill_soon() -> None:
    time.sleep(0.002)  # the call has been sent and the function runs on the server
    os.kill(os.getpid(), signal.SIGKILL)


def _writer(cat: Catalog, w: int) -> None:
    i = 0
    while True:
        i += 1
        cat.commit(
            "t",
            f"w{w}-{i}",
            updates=[
                {"source": f"a{w}", "state": {"n": i}},
                {"source": f"b{w}", "state": {"n": i}},
            ],
            external_state={f"w{w}": i},
        )
        sys.stdout.write(f"COMMITTED w{w}-{i}\n")
        sys.stdout.flush()


def main() -> None:
    url, writers = sys.argv[1], int(sys.argv[2])
    cat = Catalog(url)
    if len(sys.argv) > 3:
        _die_after(cat, int(sys.argv[3]))
    for w in range(writers):
        threading.Thread(target=_writer, args=(cat, w), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
