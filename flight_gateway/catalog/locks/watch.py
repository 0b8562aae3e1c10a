"""The locks a gateway process holds for its own work, freed the moment the process dies.

A write lease (``core.write.lease``) outlives a gateway that is SIGKILLed or crashes: other
writers of its sources waited for it to run out (``write_lease_s``, 10 s), which made every
replica kill cost the writers of the dead replica's sources seconds of waiting. A small watcher
process, started with the first lease a gateway holds on a shared (PostgreSQL) catalog, knows
which of them are held: the gateway tells it over a pipe (one JSON line per lease taken and
released). When the pipe ends, the gateway is gone, whatever killed it, and the watcher deletes
the leases it still held, so waiters get them on their next poll (within a second instead of
the lease's length). The lease itself stays as it was: a gateway that is alive but stalled
keeps its pipe open, and only the lease's expiry frees its locks (fencing covers the rest).
The watcher connects to each catalog it is told of as soon as it learns of it (psycopg, in a
thread), so that at the death the deletion is one statement on an open connection: making the
catalog's engine, connecting and deleting at the death took 0.24-0.56 s under the failover
bench, while the dead replica's writers, retried on the other replica, waited for those leases.

Only the gateway's own leases are watched: a lock a client took through ``harness.lock`` is
the client's and may be renewed through another replica. A watcher costs a Python interpreter
with the catalog package imported (~78 MB resident: the module lives in it), its open connection
~10 MB more, and that idle connection on each catalog's server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
from typing import Any

log = logging.getLogger(__name__)


class Watch:
    """This process's watcher: started on the first lease, restarted if it went away."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd = -1  # the pipe to the watcher
        self._proc: subprocess.Popen[bytes] | None = None
        self._urls: dict[str, int] = {}  # catalog URL -> its number in the messages
        self._announced: set[int] = set()  # catalogs the running watcher knows
        self._held: dict[str, int] = {}  # lock id -> catalog number

    def hold(self, catalog_url: str, lock_id: str) -> None:
        """``lock_id`` (granted on the catalog at ``catalog_url``) is this process's until
        ``release``. A SQLite catalog is one process's: nothing to watch."""
        if catalog_url.startswith("sqlite"):
            return
        with self._lock:
            n = self._urls.setdefault(catalog_url, len(self._urls))
            self._held[lock_id] = n
            if self._fd < 0:
                self._start()  # it is told every lease held, this one included
                return
            messages: list[dict[str, object]] = []
            if n not in self._announced:
                messages.append({"catalog": n, "url": catalog_url})
                self._announced.add(n)
            messages.append({"hold": lock_id, "catalog": n})
            self._send(messages)

    def release(self, lock_id: str) -> None:
        with self._lock:
            if self._held.pop(lock_id, None) is not None and self._fd >= 0:
                self._send([{"free": lock_id}])

    def _start(self) -> None:
        r, w = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "flight_gateway.catalog.locks.watch"],
                stdin=r,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # a signal to the gateway's group does not reach it
            )
        except OSError as e:
            os.close(w)
            log.warning("no lease watcher (a dead gateway's leases run out instead): %s", e)
            return
        finally:
            os.close(r)
        self._fd = w
        self._announced = set(self._urls.values())
        catalogs = [{"catalog": n, "url": url} for url, n in self._urls.items()]
        holds = [{"hold": lock_id, "catalog": n} for lock_id, n in self._held.items()]
        self._send([*catalogs, *holds])

    def _send(self, messages: list[dict[str, object]]) -> None:
        data = memoryview(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
        try:
            while data:  # one write of a line or two; a new watcher's first may be longer
                data = data[os.write(self._fd, data) :]
        except OSError as e:  # the watcher died: another starts with the next lease
            log.warning("lease watcher gone (%s); another starts with the next lease", e)
            os.close(self._fd)
            self._fd = -1


WATCH = Watch()


# --- the watcher process -----------------------------------------------------------------------


#: ``db.locks``' name (importing ``db`` takes SQLAlchemy, which the watcher does without).
LOCKS_TABLE = "harness_locks"
#: How the watcher's connection shows in ``pg_stat_activity``.
APPLICATION = "harness lease watcher"


def conninfo(url: str) -> str | None:
    """libpq's URI for a PostgreSQL catalog URL (SQLAlchemy's ``postgresql+<driver>://...``:
    the same user, host, database and query, which the psycopg dialect hands to libpq as
    they are), or None for another database."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+")[0] not in ("postgresql", "postgres"):
        return None
    return f"postgresql://{rest}"


class _Connections:
    """A connection to each catalog, made in the background as the watcher learns of it."""

    def __init__(self) -> None:
        self._made: dict[int, Any] = {}
        self._making: dict[int, threading.Thread] = {}

    def prepare(self, n: int, url: str) -> None:
        info = conninfo(url)
        if info is None or n in self._making:
            return
        thread = threading.Thread(target=self._connect, args=(n, info), daemon=True)
        self._making[n] = thread
        thread.start()

    def _connect(self, n: int, info: str) -> None:
        with contextlib.suppress(Exception):  # the death's deletion connects again, or falls back
            self._made[n] = _connect(info)

    def free(self, n: int, url: str, lock_ids: list[str]) -> None:
        """Delete ``lock_ids`` on catalog ``n``: on its connection made ahead, else on a new
        one, else through the catalog's own engine."""
        info = conninfo(url)
        thread = self._making.get(n)
        if thread is not None:
            thread.join(30)
        if info is not None:
            for con in (self._made.pop(n, None), None):
                try:
                    _delete(con if con is not None else _connect(info), lock_ids)
                    return
                except Exception:  # a connection the server closed: another one, then the engine
                    continue
        _free(url, lock_ids)


def _connect(info: str) -> Any:
    import psycopg

    return psycopg.connect(info, autocommit=True, connect_timeout=10,
                           application_name=APPLICATION)  # fmt: skip


def _delete(con: Any, lock_ids: list[str]) -> None:
    try:
        con.execute(f"DELETE FROM {LOCKS_TABLE} WHERE lock_id = ANY(%s)", [lock_ids])
    finally:
        con.close()


def _free(url: str, lock_ids: list[str]) -> None:
    from sqlalchemy import delete

    from flight_gateway.catalog import db

    engine = db.make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(delete(db.locks).where(db.locks.c.lock_id.in_(lock_ids)))
    finally:
        engine.dispose()


def _password(url: str) -> str | None:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).password
    except Exception:
        return None


def main() -> int:
    urls: dict[int, str] = {}
    held: dict[str, int] = {}
    connections = _Connections()
    for line in sys.stdin.buffer:
        try:
            message = json.loads(line)
        except ValueError:  # the last line, cut by the gateway's death
            break
        if "url" in message:
            urls[int(message["catalog"])] = str(message["url"])
            connections.prepare(int(message["catalog"]), str(message["url"]))
        elif "hold" in message:
            held[str(message["hold"])] = int(message["catalog"])
        elif "free" in message:
            held.pop(str(message["free"]), None)
    by_catalog: dict[int, list[str]] = {}
    for lock_id, n in held.items():
        by_catalog.setdefault(n, []).append(lock_id)
    for n, lock_ids in by_catalog.items():
        try:
            connections.free(n, urls[n], lock_ids)
        except Exception as e:  # their leases run out instead
            text = str(e)
            password = _password(urls[n])
            if password:
                text = text.replace(password, "***")
            sys.stderr.write(f"lease watcher: could not free {len(lock_ids)} lease(s): {text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
