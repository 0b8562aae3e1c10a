"""The process a Flight SQL statement runs in: DuckDB under a hard memory bound.

Why a process of its own: DuckDB evaluates constant expressions while it binds a statement, and
its ``memory_limit`` covers its buffer manager, not the strings and lists expressions compute
(``SELECT length(repeat('x', 400000000))`` reached 971 MB with ``memory_limit=100MB``). In the
gateway's process a few such calls, typing included, took it from 222 MB to 2.5 GB. Here the
process's data segment is capped (``RLIMIT_DATA``: the worker's own size after start-up plus
``limits.sql_memory_limit_mb``), so an allocation past it fails inside DuckDB, which reports
"Out of Memory" for that statement alone (measured: the process and its next statement are
fine), and nothing a statement computes can reach the gateway's memory.

The gateway (``workers.py``) talks to a worker over a Unix socket: one JSON request at a time,
with file descriptors attached (the result pipe, an interrupt pipe, one pipe per streamed
source), and one JSON answer when the statement has ended (then, for a statement that took a
while, a "settled" message once its database is closed). The result travels as an Arrow IPC
stream on its own pipe. This module imports only DuckDB and pyarrow: it is the worker's
``__main__`` (``python -m flight_gateway.faces.flightsql.worker FD``).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import queue
import resource
import select
import socket
import struct
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_HEADER = struct.Struct("!I")
MAX_FDS = 256
#: Buffer of the files over the result and stream pipes (Python reads of a pipe return what
#: is there; Arrow's IPC reader needs whole messages, which buffered reads assemble).
PIPE_BUFFER = 1 << 20
#: A spare database (its PostgreSQL servers attached: about 80 ms each) is kept this long.
SPARE_IDLE_S = 60.0
#: Spare databases a worker keeps ready for each set of servers...
SPARES = 2
#: ... of the sets its latest statements attached (a statement over PostgreSQL sources and one
#: over files alone, in turns, each find theirs: attaching a server costs ~80 ms).
SPARE_KEYS = 2
#: Databases whose sandbox a statement over files alone locked to its files (and to those of
#: the database it replaces), kept for the next statements of the same caller over files among
#: them (a fresh database costs ~8 ms of CPU, a tiny statement's ~10 ms; a connection to a kept
#: one ~0.05 ms): for the callers (``scope``) of this many latest statements...
LOCKED_KEYS = 2
#: ... up to this many files each (a statement over others gets a database locked to its own).
LOCKED_MAX_FILES = 10_000
#: ... when what the statement left in the database (DuckDB's buffers: cached blocks of the
#: files) is at most this.
LOCKED_MAX_BYTES = 16 << 20
#: ... and while the worker's resident memory is at most this much over its size when it
#: started: after a large statement DuckDB's allocator holds what it freed until a database
#: closes (~190 MB after TPC-H SF 1 queries; the process's, reused by any database: a kept one
#: takes nothing from the next statement's bound), and the gateway replaces a worker grown
#: past ``workers.RECYCLE_MB`` (256).
KEEP_GROWN_BYTES = 192 << 20
#: Databases a worker may keep between statements: its spares, its locked ones and the typing
#: database.
KEPT_DATABASES = SPARES * SPARE_KEYS + LOCKED_KEYS + 1
#: A statement that took less than this has its database closed after its answer.
QUICK_S = 0.05
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


# --- framing (both sides) ----------------------------------------------------------------------


def send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    frame = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [frame[:4096]], list(fds))
        if len(frame) > 4096:
            sock.sendall(frame[4096:])
    else:
        sock.sendall(frame)


def receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and its descriptors; (None, []) when the other side has gone. Reads
    exactly one message: another may follow it at once (a "settled" after an answer)."""
    data, fds, _, _ = socket.recv_fds(sock, _HEADER.size, MAX_FDS)
    if not data:
        return None, list(fds)
    while len(data) < _HEADER.size:
        more = sock.recv(_HEADER.size - len(data))
        if not more:
            return None, list(fds)
        data += more
    (size,) = _HEADER.unpack(data[: _HEADER.size])
    body = data[_HEADER.size :]
    while len(body) < size:
        more = sock.recv(min(1 << 20, size - len(body)))
        if not more:
            return None, list(fds)
        body += more
    return json.loads(body), list(fds)


# --- the worker --------------------------------------------------------------------------------


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmData", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def resident(pid: int | str = "self") -> int:
    """A process's resident bytes (this one's by default): ``statm`` is one short line, half
    the cost of ``status`` (read after each tiny statement)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE_BYTES


def spill_prefix(pid: int) -> str:
    """The start of the name of each spill directory of worker ``pid``'s databases."""
    return f"harness-sql-{pid}-"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class Worker:
    def __init__(self, sock: socket.socket, limits: dict[str, Any]) -> None:
        import duckdb

        self.duckdb = duckdb
        self.sock = sock
        self.limits = limits
        #: Resident memory when it started (``main`` sets it again once warmed up).
        self.base_rss = resident()
        #: Databases made ahead for the next statements (when made, the database) by the
        #: servers they attach, the set used last at the end.
        self.spares: OrderedDict[tuple[str, ...], list[tuple[float, Any]]] = OrderedDict()
        self._spare_lock = threading.Lock()
        #: Numbers the databases made (each spills to a directory of its own): ``next`` on a
        #: count is atomic, and a statement's thread and the maker may make one at once.
        self._made = itertools.count(1)
        self._closing: queue.SimpleQueue[list[Any]] | None = None
        self._wanted: queue.SimpleQueue[tuple[str, ...]] | None = None
        #: The database that types statements over empty views (``typing_only``), made once:
        #: external access off and its configuration locked, each typing on a connection of
        #: its own, whose temporary views go with it. A fresh database costs ~10 ms, half a
        #: new statement's time in the worker.
        self._typing: Any = None
        #: Databases locked to the files of statements (``Locked``) by their caller's scope,
        #: the one used last at the end: only the statement thread uses them.
        self.locked: OrderedDict[str, Locked] = OrderedDict()
        #: The running statement's database when it may be kept (``keep``).
        self._current: Locked | None = None
        self.watcher = Watcher()

    def connect(self, dsns: Sequence[str]) -> Any:
        """A fresh DuckDB database with the statement limits and ``dsns`` attached read-only as
        ``__pg_<i>`` (one made ahead, when one fits)."""
        key, now = tuple(dsns), time.monotonic()
        stale: list[Any] = []
        con = None
        with self._spare_lock:
            ready = self.spares.get(key, [])
            while ready and con is None:
                made, c = ready.pop()
                if now - made < SPARE_IDLE_S:
                    con = c
                else:
                    stale.append(c)
        for c in stale:
            c.close()
        return con if con is not None else self._new(key)

    def _new(self, dsns: Sequence[str]) -> Any:
        limits = self.limits
        con = self.duckdb.connect(
            config={
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
                "memory_limit": f"{int(limits['duckdb_memory_mb'])}MB",
                "threads": int(limits["threads"]),
                # Kept databases (``keep``) would hold the blocks of the files they read
                # (10-22 MB after TPC-H SF 1 queries), past ``LOCKED_MAX_BYTES``; reading them
                # again from the page cache measured no slower (22 queries: 2.69 s vs 2.73 s).
                "enable_external_file_cache": False,
            }
        )
        # A directory of its own, not created: DuckDB creates it on the first spill and
        # removes it when the database closes (the gateway removes a killed worker's).
        name = f"{spill_prefix(os.getpid())}{next(self._made)}"
        spill = os.path.join(limits["spill_root"], name)
        try:
            # Results do not depend on the gateway's zone; GLOBAL: the typing database's
            # connections (``typing_connection``) take it too. One call: each costs ~0.2 ms.
            con.execute(
                "SET GLOBAL TimeZone = 'UTC'; "
                f"SET temp_directory = {_quote(spill)}; "
                f"SET max_temp_directory_size = '{int(limits['spill_limit_mb'])}MB'; "
                f"SET allowed_directories = [{_quote(spill + os.sep)}]"
            )
            if dsns:
                import duckdb_extensions

                duckdb_extensions.import_extension("postgres", con=con)
            for i, dsn in enumerate(dsns):
                con.execute(f"ATTACH {_quote(dsn)} AS __pg_{i} (TYPE postgres, READ_ONLY)")
        except BaseException:
            con.close()
            raise
        return con

    def typing_connection(self) -> Any:
        if self._typing is None:
            con = self._new(())
            try:
                con.execute("SET enable_external_access = false; SET lock_configuration = true")
            except BaseException:
                con.close()
                raise
            self._typing = con
        return self._typing.cursor()

    def forget_typing(self) -> None:
        """After a typing that failed for want of memory, or unexpectedly: the next one gets
        a new database."""
        if self._typing is not None:
            _close_all([self._typing])
            self._typing = None

    def after(self, dsns: tuple[str, ...], used: list[Any]) -> None:
        """Off the statement's path, once its answer is sent: close what it used (~1 ms), and
        make databases for the next statements (opening one costs ~8 ms, most of a tiny
        statement's time in the worker; attaching servers more). Two are kept, so a statement
        that arrives while the next one is being made does not wait for it. One thread closes
        and another makes, for every statement: starting a thread costs ~0.3 ms, and making
        behind closing fell behind statements of a few ms."""
        if self._closing is None or self._wanted is None:
            self._closing, self._wanted = queue.SimpleQueue(), queue.SimpleQueue()
            threading.Thread(target=self._closer, daemon=True, name="closer").start()
            threading.Thread(target=self._maker, daemon=True, name="spares").start()
        if used:
            self._closing.put(used)
        self._wanted.put(dsns)

    def _closer(self) -> None:
        assert self._closing is not None
        while True:
            _close_all(self._closing.get())

    def _maker(self) -> None:
        assert self._wanted is not None
        while True:
            dsns = self._wanted.get()
            with contextlib.suppress(queue.Empty):
                while True:  # only the servers of the latest statement matter
                    dsns = self._wanted.get_nowait()
            self._refill(dsns)

    def _refill(self, dsns: tuple[str, ...]) -> None:
        with self._spare_lock:
            self.spares.setdefault(dsns, [])
            self.spares.move_to_end(dsns)
            stale = []
            while len(self.spares) > SPARE_KEYS:
                stale += self.spares.popitem(last=False)[1]
        for _, c in stale:
            c.close()
        while True:
            with self._spare_lock:
                if len(self.spares.get(dsns, ())) >= SPARES:
                    return
            try:
                con = self._new(dsns)
            except Exception:  # the next statement reports it when it needs the servers
                return
            with self._spare_lock:
                if dsns in self.spares:  # not dropped for other sets meanwhile
                    self.spares[dsns].insert(0, (time.monotonic(), con))
                    con = None
            if con is not None:
                con.close()

    def _database(self, request: dict[str, Any], used: list[Any]) -> tuple[Any, list[str] | None]:
        """A connection of its own for the statement (its relations go with it) to its caller's
        database locked to files among which are all of the statement's, or to a fresh one
        (left in ``used``); for a fresh one, the files to lock it to: the statement's and,
        within ``LOCKED_MAX_FILES``, those of its caller's database it replaces."""
        scope = locked_scope(request)
        files = list(dict.fromkeys(request.get("files", [])))
        if scope is None:
            db = self.connect(request.get("dsns") or [])
            used.append(db)
            return db.cursor(), files
        held = self.locked.get(scope)
        if held is not None and time.monotonic() - held.made >= SPARE_IDLE_S:
            del self.locked[scope]
            _close_all([held.db])
            held = None
        if held is not None and held.allowed.issuperset(files):
            del self.locked[scope]  # back in ``keep`` if the statement leaves it fit
            self._current = held
            used.append(held.db)
            return held.db.cursor(), None
        allowed = files
        if held is not None and len(held.allowed | set(files)) <= LOCKED_MAX_FILES:
            allowed = sorted(held.allowed | set(files))
        db = self.connect(())
        self._current = Locked(time.monotonic(), db, frozenset(allowed))
        used.append(db)
        return db.cursor(), allowed

    def keep(self, request: dict[str, Any], answer: dict[str, Any], used: list[Any]) -> bool:
        """Keep the statement's database (``used``: its connection, then it) for its caller's
        next statements over its files, whatever the statement took: one over files alone,
        nothing materialized, that ended well or with an error of its own SQL, and left little
        in the database (its buffers: the file cache is off, ``_new``) and in the worker
        (``KEEP_GROWN_BYTES``). It replaces the one its caller had. Whether it was kept: what
        is left in ``used`` is for ``after`` to close.
        Why a long statement's too: the first query in a database costs ~25 ms more than in
        one that ran queries before (TPC-H SF 1, 22 queries over the cold kinds: 3.33 s in a
        fresh database each against 2.73 s in a kept one), and making and closing one per
        statement takes CPU from the next statement's threads."""
        current, self._current = self._current, None
        scope = locked_scope(request)
        if scope is None or current is None or len(used) != 2:
            return False
        if answer.get("error") not in (None, "query") or _materializes(request):
            return False
        con, db = used
        if db is not current.db:
            return False
        _close_all([con])
        used.remove(db)
        try:
            held = db.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()
        except Exception:
            held = None
        grown = resident() - self.base_rss
        if held is None or (held[0] or 0) > LOCKED_MAX_BYTES or grown > KEEP_GROWN_BYTES:
            used.append(db)
            return False
        replaced = self.locked.pop(scope, None)
        if replaced is not None:
            used.append(replaced.db)
        self.locked[scope] = current
        while len(self.locked) > LOCKED_KEYS:
            used.append(self.locked.popitem(last=False)[1].db)
        return True

    # ------------------------------------------------------------------ one statement

    def run(self, request: dict[str, Any], fds: list[int], used: list[Any]) -> dict[str, Any]:
        """Run one statement; its database is left in ``used`` for ``after`` to close. The
        stream pipes are closed here, before the answer: a feeder still writing stops at once."""
        op = request["op"]
        result_fd = fds.pop(0) if op == "run" else None
        interrupt_fd = fds.pop(0)
        opened: list[Any] = []  # files over the stream pipes (they own those descriptors)
        finished = threading.Event()
        ended_w = -1  # closed when the statement has ended: the watcher then lets it go
        shared = typing_only(request)
        try:
            if shared:
                con, lock_to = self.typing_connection(), None
            else:
                con, lock_to = self._database(request, used)
            used.insert(0, con)
            ended_r, ended_w = os.pipe()
            self.watcher.watch(Watched(interrupt_fd, ended_r, con, finished))
            interrupt_fd = -1  # the watcher closes it
            try:
                if shared:
                    for step in request["steps"]:
                        con.execute(step["sql"])
                else:
                    _setup(con, request, fds, opened, lock_to)
            except Exception as e:
                raise SetupFailed(e) from e
            if op == "schema":
                schema = con.sql(request["sql"]).limit(0).to_arrow_table().schema
                return {"schema": base64.b64encode(schema.serialize().to_pybytes()).decode()}
            assert result_fd is not None
            sink, result_fd = result_fd, None
            return {"rows": _stream(con, request["sql"], int(request["batch_rows"]), sink)}
        except BaseException as e:
            return {"error": _kind(e, self.duckdb), "message": str(e)[:4000]}
        finally:
            finished.set()
            for left in [result_fd, interrupt_fd, ended_w, *fds]:
                if left is not None and left >= 0:
                    _close_fd(left)
            for f in opened:
                with contextlib.suppress(OSError):
                    f.close()

    def serve(self) -> None:
        self.after((), [])
        while True:
            request, fds = receive(self.sock)
            if request is None or request.get("op") == "exit":
                return
            used: list[Any] = []
            started = time.monotonic()
            answer = self.run(request, fds, used)
            shared = typing_only(request)
            quick = _quick(request, time.monotonic() - started)
            kept = False
            if shared:
                _close_all(used)
                if answer.get("error") in ("memory", "internal"):
                    self.forget_typing()
            elif not quick:  # decided before the answer: a database kept is not closed
                kept = self.keep(request, answer, used)
            settling = not shared and not quick and not kept
            if settling:
                answer["settling"] = True
            send(self.sock, answer)
            if settling:
                # A larger statement's database is closed (~5-10 ms, freeing its memory) after
                # its answer, off its caller's path, but before the gateway lends the worker
                # again (it waits for this message): the worker's size the gateway checks then,
                # and the next statement's memory bound, do not count it.
                _close_all(used)
                send(self.sock, {"settled": True})
            if quick and not shared:  # after the answer: off a tiny statement's path
                self.keep(request, answer, used)
            if not shared:  # a typing used no database of the spares
                self.after(tuple(request.get("dsns") or ()), used)


def typing_only(request: dict[str, Any]) -> bool:
    """Whether a request types a statement over views that read nothing (no file, server,
    stream or spill: the relations of a typing are empty): it runs on the shared typing
    database, which can read nothing either."""
    if request["op"] != "schema" or request.get("dsns") or request.get("files"):
        return False
    return all(
        str(s.get("sql", "")).startswith("CREATE TEMP VIEW ") for s in request.get("steps", [])
    )


@dataclass(frozen=True)
class Locked:
    """A database whose sandbox is locked to ``allowed`` (when made)."""

    made: float
    db: Any
    allowed: frozenset[str]


def locked_scope(request: dict[str, Any]) -> str | None:
    """Whose locked database a statement may use: its caller's (the gateway's ``scope``: the
    principal and its grants), for a statement over files alone (a database with servers
    attached keeps their catalogs, which a server's writers may change, and is not kept)."""
    if request.get("dsns") or typing_only(request) or not request.get("scope"):
        return None
    return str(request["scope"])


def _quick(request: dict[str, Any], took_s: float) -> bool:
    """Whether a statement's database, when not kept (``Worker.keep``), may be closed by the
    closer thread while the worker goes on (closing costs ~2 ms): a short statement without
    temporary tables. A larger one's memory is freed before the worker takes another statement
    (``serve``: its "settled" message), so that the worker's size the gateway checks then (it
    recycles a worker that grew) and the next statement's memory bound do not count it."""
    return took_s < QUICK_S and not _materializes(request)


def _materializes(request: dict[str, Any]) -> bool:
    return any(step.get("materialize") for step in request.get("steps", []))


def _close_all(things: list[Any]) -> None:
    for thing in things:
        with contextlib.suppress(Exception):
            thing.close()
    things.clear()


def _setup(
    con: Any, request: dict[str, Any], fds: list[int], opened: list[Any], lock_to: list[str] | None
) -> None:
    """The statement's relations, then the sandbox unless locked already (``lock_to`` None):
    external access off but to the files ``lock_to`` (the pinned files; ``Worker._database``)
    and the database's spill directory (``Worker._new``), config locked (the settings are the
    database's: its later connections find them)."""
    import pyarrow as pa

    for step in request.get("steps", []):
        if "sql" in step:
            con.execute(step["sql"])
            continue
        i = int(step["fd"])
        source = os.fdopen(fds[i], "rb", buffering=PIPE_BUFFER)
        fds[i] = -1
        opened.append(source)
        con.register(step["stream"], pa.ipc.open_stream(source))
        if step.get("materialize"):  # read several times: DuckDB keeps it (spilling)
            con.execute(
                f"CREATE TEMP TABLE {step['stream']}_rows AS SELECT * FROM {step['stream']}"
            )
            con.unregister(step["stream"])
    if lock_to is None:
        return
    paths = ", ".join(_quote(f) for f in lock_to)
    con.execute(
        f"SET allowed_paths = [{paths}]; SET enable_external_access = false; "
        "SET lock_configuration = true"
    )


def _stream(con: Any, sql: str, batch_rows: int, fd: int) -> int:
    """The result as an Arrow IPC stream on ``fd`` (closed here); the end-of-stream marker
    only when whole."""
    import pyarrow as pa

    sink = os.fdopen(fd, "wb", buffering=PIPE_BUFFER)
    try:
        reader = con.execute(sql).to_arrow_reader(batch_rows)
        rows = 0
        writer = pa.ipc.new_stream(sink, reader.schema)
        sink.flush()  # the schema now: a new statement's GetFlightInfo waits for it (service)
        for batch in reader:
            writer.write_batch(batch)
            rows += batch.num_rows
        writer.close()
        sink.flush()
        return rows
    finally:
        # Without the end-of-stream marker when it failed: the reader cannot take a part for
        # the whole.
        with contextlib.suppress(OSError):
            sink.close()


@dataclass
class Watched:
    """A running statement under the watcher: its interrupt pipe (the gateway writes to it, or
    closes it, to stop the statement), a pipe its thread closes when it has ended, its
    connection and its end."""

    interrupt_fd: int
    ended_fd: int
    con: Any
    finished: threading.Event


class Watcher:
    """Interrupts the running statement when the gateway asks, from one thread for the
    worker's life: starting a thread for each statement cost 0.08-0.2 ms of a tiny statement's
    ~2 ms in the worker. A statement at a time runs in a worker, but the gateway may close a
    statement's interrupt pipe after the next has started: each is let go when its own thread
    says it has ended, whatever the gateway does with its pipe."""

    def __init__(self) -> None:
        self._statements: queue.SimpleQueue[Watched] = queue.SimpleQueue()
        threading.Thread(target=self._loop, daemon=True, name="interrupts").start()

    def watch(self, statement: Watched) -> None:
        """Watch ``statement`` (the watcher closes both its pipes)."""
        self._statements.put(statement)

    def _loop(self) -> None:
        while True:
            statement = self._statements.get()
            with contextlib.suppress(Exception):  # a statement's failure is its thread's
                _watch(statement)
            _close_fd(statement.interrupt_fd)
            _close_fd(statement.ended_fd)


def _watch(statement: Watched) -> None:
    """Interrupt the statement when the gateway writes to (or closes) the interrupt pipe before
    it has ended: its time ran out, or its caller went away. DuckDB's interrupt stops only the
    query running at that moment: one asked for between two (while the statement's relations
    are made, or just before its query starts: a statement started early and cancelled at
    once) was lost, and the statement ran until the gateway killed its worker (``GRACE_S``,
    seen in CI). So it is asked again until the statement has ended."""
    waiting = select.poll()
    waiting.register(statement.interrupt_fd, select.POLLIN)
    waiting.register(statement.ended_fd, select.POLLIN)
    while True:
        ready = {fd for fd, _ in waiting.poll()}
        if statement.interrupt_fd in ready:
            break
        if statement.ended_fd in ready:
            return
    while not statement.finished.is_set():
        statement.con.interrupt()
        statement.finished.wait(0.05)


class SetupFailed(Exception):
    """Creating the statement's relations failed: a source, not the caller's SQL."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _kind(e: BaseException, duckdb: Any) -> str:
    if isinstance(e, SetupFailed):
        inner = _kind(e.cause, duckdb)
        return inner if inner in ("memory", "interrupted") else "source"
    if isinstance(e, duckdb.InterruptException):
        return "interrupted"
    if isinstance(e, MemoryError | duckdb.OutOfMemoryException) or "Out of Memory" in str(e):
        return "memory"
    if isinstance(e, BrokenPipeError) or "Broken pipe" in str(e):
        return "interrupted"  # the gateway closed the result: its caller went away
    if isinstance(e, duckdb.IOException):
        return "io"
    if isinstance(e, duckdb.Error):
        return "query"
    return "internal"


def _close_fd(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _bound_memory(headroom_mb: int, kept: int = 0) -> int:
    """Cap the data segment at what the worker uses now, the databases it keeps (``kept``
    bytes) and the statement's allowance."""
    limit = _status()["VmData"] + kept + (int(headroom_mb) << 20)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return limit


def main(argv: Sequence[str]) -> int:
    limits = json.loads(argv[1])
    sock = socket.socket(fileno=int(argv[0]))
    import pyarrow as pa

    worker = Worker(sock, limits)
    # Warm up what every statement uses (DuckDB's threads, the postgres extension, the IPC
    # writer) before measuring the size the memory bound is added to.
    con = worker._new(())
    con.execute("SELECT sum(range) FROM range(100000)").fetchall()
    pa.ipc.new_stream(pa.BufferOutputStream(), pa.schema([])).close()
    import duckdb_extensions

    duckdb_extensions.import_extension("postgres", con=con)
    # The databases a worker keeps between statements (spares, the typing database) are its
    # own, not a statement's: ~10 MB of data segment each (DuckDB's threads' stacks, its
    # catalog), which the bound must not take from a statement's allowance.
    before = _status()["VmData"]
    probe = worker._new(())
    # A locked database keeps what its statement left too (``keep``: at most LOCKED_MAX_BYTES).
    kept = max(0, _status()["VmData"] - before) * KEPT_DATABASES + LOCKED_MAX_BYTES * LOCKED_KEYS
    probe.close()
    con.close()
    limit = _bound_memory(int(limits["memory_limit_mb"]), kept)
    worker.base_rss = resident()
    send(sock, {"ready": os.getpid(), "data_limit": limit, "VmRSS": worker.base_rss})
    worker.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
