"""Statement worker processes, from the gateway's side: started, lent, taken back, replaced.

Each Flight SQL statement, and each typing of one, runs in a worker process (``worker.py``)
under a hard memory bound, so a statement past its memory fails alone and the gateway's own
memory is not the statement's. The pool holds at most ``limits.max_concurrent_statements``
workers (the gateway-wide statement slots bound how many are lent at once); idle ones wait
warm for the next statement (starting one takes about 0.4 s: Python, DuckDB, pyarrow). A worker
that died, was killed or grew past its start-up size by more than ``RECYCLE_MB`` is replaced.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from flight_gateway.faces.flightsql import worker as protocol
from flight_gateway.faces.flightsql.deadlines import Deadline, Deadlines
from flight_gateway.protocol.errors import (
    Cancelled,
    HarnessError,
    ResourceExhausted,
    Unavailable,
)

log = logging.getLogger(__name__)

#: A worker whose resident size grew this far past its start-up size is replaced after its
#: statement (memory its allocators kept would otherwise count against the next statement).
RECYCLE_MB = 256
#: How long a worker has to stop after it was interrupted before it is killed.
GRACE_S = 10.0
PIPE_BYTES = 1 << 20
START_TIMEOUT_S = 60.0
#: Every statement's time limit (``Execution.interrupt`` only writes to a pipe: it never blocks).
DEADLINES = Deadlines()


@dataclass(frozen=True)
class WorkerLimits:
    """What a worker is started with (``SqlLimits`` of the gateway)."""

    memory_limit_mb: int  # hard: the worker's size at start plus this
    duckdb_memory_mb: int  # DuckDB's buffer manager spills past this
    threads: int
    #: Each database of the worker spills to ``<spill_root>/harness-sql-<pid>-<n>``, at most
    #: ``spill_limit_mb``.
    spill_root: str
    spill_limit_mb: int

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


class WorkerDied(Exception):
    pass


class Worker:
    def __init__(self, limits: WorkerLimits) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system"}
        cmd = [sys.executable, "-m", "flight_gateway.faces.flightsql.worker", str(child.fileno())]
        self.limits = limits
        self.proc = subprocess.Popen(
            [*cmd, limits.to_json()], pass_fds=[child.fileno()], env=env, stdin=subprocess.DEVNULL
        )
        child.close()
        self.sock = parent
        self.killed = False
        parent.settimeout(START_TIMEOUT_S)
        try:
            ready, _ = protocol.receive(parent)
        except OSError as e:
            self.kill()
            raise Unavailable(f"a statement worker did not start: {e}") from e
        parent.settimeout(None)
        if ready is None or "ready" not in ready:
            self.kill()
            raise Unavailable("a statement worker did not start (see the gateway's log)")
        self.base_rss = int(ready["VmRSS"])
        self.data_limit = int(ready["data_limit"])
        #: Its last answer said it still closes that statement's database: a "settled" message
        #: follows, read before it is lent again (``settle``).
        self.settling = False
        #: Its last statement's answer is still to be read, before it is lent again
        #: (``settle``): the statement's result ended whole (``Execution.stream``).
        self.unanswered = False

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def ask(self, request: dict[str, Any], fds: Sequence[int]) -> None:
        try:
            protocol.send(self.sock, request, fds)
        except OSError as e:
            raise WorkerDied(str(e)) from e

    def answer(self) -> dict[str, Any]:
        try:
            message, fds = protocol.receive(self.sock)
        except OSError as e:
            raise WorkerDied(str(e)) from e
        for fd in fds:
            os.close(fd)
        if message is None:
            raise WorkerDied(f"exit status {self.proc.wait()}")
        self.settling = bool(message.get("settling"))
        return message

    def settle(self) -> None:
        """Wait until the worker has answered for its last statement and freed its database."""
        if self.unanswered:
            self.unanswered = False
            if "error" in self.answer():  # after a whole result: not to be trusted again
                raise WorkerDied("a statement worker failed after its result")
        if self.settling:
            self.settling = False
            if "settled" not in self.answer():
                raise WorkerDied("a statement worker answered out of turn")

    def kill(self) -> None:
        self.killed = True
        with contextlib.suppress(OSError):
            self.proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(5)
        self.sock.close()
        # What its databases had spilled: DuckDB removes a database's directory when the
        # database closes, which a killed worker's never did.
        prefix = protocol.spill_prefix(self.pid)
        with contextlib.suppress(OSError), os.scandir(self.limits.spill_root) as entries:
            for entry in entries:
                if entry.name.startswith(prefix):
                    shutil.rmtree(entry.path, ignore_errors=True)

    def rss(self) -> int:
        try:
            return protocol.resident(self.pid)
        except OSError:
            return 0


class WorkerPool:
    def __init__(self, limits: WorkerLimits, size: int) -> None:
        self.limits, self.size = limits, size
        self._idle: list[Worker] = []
        self._lent = 0
        self._lock = threading.Lock()
        self._closed = False
        self._warming = False
        self._starting = 0  # workers being started ahead (``_prewarm``)
        self._started_one = threading.Condition(self._lock)
        self.started = 0  # workers started so far (metrics, tests)

    def warm(self) -> None:
        """Start a worker ahead of the first statement (once; called on the first Flight SQL
        call a gateway sees, so one that serves no SQL starts none)."""
        with self._lock:
            if self._warming or self._closed:
                return
            self._warming = True
        threading.Thread(target=self._prewarm, daemon=True, name="sql-worker-start").start()

    def _prewarm(self) -> None:
        with self._lock:
            self._starting += 1
        try:
            self._put(Worker(self.limits))
        except HarnessError as e:
            log.warning("no statement worker started ahead: %s", e)
        finally:
            with self._lock:
                self._starting -= 1
                self._started_one.notify_all()

    def _put(self, w: Worker) -> None:
        with self._lock:
            if not self._closed and len(self._idle) + self._lent < self.size:
                self.started += 1
                self._idle.append(w)
                return
        w.kill()

    def ready(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the worker ``warm`` started ahead (a client's first
        Flight SQL call starts it: ADBC's and JDBC's connect do); whether one is idle. A
        benchmark of a version's first statements waits for it, as a client that connects
        before it sends its first statement finds it up: starting the process (~0.2 s) is the
        gateway's, once, not the version's."""
        self.warm()  # started already by the client's first call, unless it made none
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not self._idle and time.monotonic() < deadline:
                self._started_one.wait(max(0.0, deadline - time.monotonic()))
            return bool(self._idle)

    def _wait_for_start(self) -> bool:
        """Wait for a worker being started ahead, if one is (starting another beside it on
        2 cores made the first statement of a gateway ~0.25 s slower); whether one was."""
        with self._lock:
            if not self._starting or self._idle:
                return bool(self._idle)
            self._started_one.wait(START_TIMEOUT_S)
            return True

    def take(self) -> Worker:
        waited = False
        while True:
            w = self._take_idle()
            if w is None:
                if not waited and self._wait_for_start():
                    waited = True  # once: a worker started meanwhile may be taken by another
                    continue
                break
            try:
                w.settle()
            except WorkerDied:
                w.kill()
            else:
                if not self._grown(w):
                    return w
                w.kill()
            with self._lock:
                self._lent -= 1
            self._replace()
        with self._lock:
            self._lent += 1
        try:
            w = Worker(self.limits)
        except BaseException:
            with self._lock:
                self._lent -= 1
            raise
        with self._lock:
            self.started += 1
        return w

    def _take_idle(self) -> Worker | None:
        with self._lock:
            if self._closed:
                raise Unavailable("the gateway is shutting down")
            if not self._idle:
                return None
            self._lent += 1
            # The latest given back that is not closing a database, else the latest.
            ready = [i for i, w in enumerate(self._idle) if not w.settling]
            return self._idle.pop(ready[-1] if ready else -1)

    def take_idle(self) -> Worker | None:
        """The idle worker given back last, or None: never starts one (a statement started
        early, ``early``). One still closing its last statement's database is waited for
        (a few ms, as ``take`` does): it has the databases made ahead for the servers that
        statement attached, and another would attach them afresh (~0.1 s) for the next.
        The worker being started ahead (``warm``) is waited for too: a gateway's first
        statement, sent as its client connected, would otherwise be typed on it apart and
        then run again by its DoGet."""
        self._wait_for_start()
        with self._lock:
            if self._closed or not self._idle:
                return None
            self._lent += 1
            w = self._idle.pop()
        try:
            w.settle()
        except WorkerDied:
            self.give_back(w, healthy=False)
            return None
        if self._grown(w):
            self.give_back(w, healthy=True)  # recycled
            return None
        return w

    @staticmethod
    def _grown(w: Worker) -> bool:
        return w.rss() - w.base_rss > RECYCLE_MB << 20

    def give_back(self, w: Worker, healthy: bool) -> None:
        """A worker still closing its statement's database (``settling``) is checked for size
        when it is taken next, once it has."""
        grown = not w.settling and self._grown(w)
        with self._lock:
            self._lent -= 1
            if healthy and not grown and not w.killed and not self._closed:
                self._idle.append(w)
                return
        if not w.killed:
            w.kill()
        self._replace()

    def _replace(self) -> None:
        if not self._closed:  # the replacement starts now, off the next statement's path
            threading.Thread(target=self._prewarm, daemon=True, name="sql-worker-start").start()

    def pids(self) -> list[int]:
        with self._lock:
            return [w.pid for w in self._idle]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for w in idle:
            with contextlib.suppress(Exception):
                w.ask({"op": "exit"}, ())
            w.kill()


# --- one statement -----------------------------------------------------------------------------


@dataclass
class Plan:
    """What a worker runs: setup steps (SQL, or a stream registered from a pipe), the statement,
    the files DuckDB may open, the PostgreSQL servers to attach."""

    sql: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    streams: list[Callable[[], pa.RecordBatchReader]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    dsns: tuple[str, ...] = ()
    #: The statement as written before the relations were put in front of it (an error's
    #: excerpt of anything else is not shown: ``engine.without_relations``).
    statement: str | None = None

    def request(self, op: str, batch_rows: int, scope: str = "") -> dict[str, Any]:
        """What the worker is sent; ``scope``: whose statement it is (the caller and its grants):
        a worker reuses a database locked to a caller's files for that caller alone."""
        return {
            "op": op,
            "scope": scope,
            "sql": self.sql,
            "steps": self.steps,
            "files": self.files,
            "dsns": list(self.dsns),
            "batch_rows": batch_rows,
        }


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    with contextlib.suppress(OSError):  # a larger pipe: fewer wake-ups per batch
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    return r, w


def _close(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class _Feeder(threading.Thread):
    """Writes one streamed source into its pipe as Arrow IPC. A source that fails leaves bytes
    no IPC reader accepts, so the worker's read of it fails instead of ending short."""

    def __init__(self, open_: Callable[[], pa.RecordBatchReader], fd: int) -> None:
        super().__init__(daemon=True, name="sql-feed")
        self.open, self.fd = open_, fd
        self.error: BaseException | None = None

    def run(self) -> None:
        sink = None
        try:
            reader = self.open()
            sink = os.fdopen(self.fd, "wb", buffering=protocol.PIPE_BUFFER)
            with pa.ipc.new_stream(sink, reader.schema) as writer:
                for batch in reader:
                    writer.write_batch(batch)
        except BaseException as e:
            if not _broken_pipe(e):  # the statement did not need the rest: not a failure
                self.error = e
                with contextlib.suppress(OSError, ValueError):
                    if sink is not None:
                        sink.write(b"\xff\xff\xff\xff\xff\xff\xff\x7f")  # an impossible length
        finally:
            if sink is not None:
                with contextlib.suppress(OSError, ValueError):
                    sink.close()
            else:
                _close(self.fd)


def _broken_pipe(e: BaseException) -> bool:
    return isinstance(e, BrokenPipeError) or "Broken pipe" in str(e)


class NoResult(Exception):
    """A statement ended, or was stopped, before its result's schema."""


class Execution:
    """A statement lent a worker: feeds its streams, reads its result, returns the worker."""

    def __init__(
        self,
        pool: WorkerPool,
        plan: Plan,
        op: str,
        *,
        timeout_s: float,
        batch_rows: int,
        translate: Callable[[str, str], BaseException],
        scope: str = "",
        worker: Worker | None = None,
    ) -> None:
        """``worker``: one taken from ``pool`` already (else one is taken here)."""
        self.pool, self.plan, self.translate = pool, plan, translate
        # Before anything can fail: ``_died`` reads them.
        self.timed_out = False
        self.cancelled = False
        self.timer: Deadline | None = None
        self.worker = worker if worker is not None else pool.take()
        self._done = False
        self._finishing = threading.Lock()
        self._answered = False
        self.result_r: int | None = None
        self.source: Any = None
        #: The result's reader once opened (``result_schema`` or ``stream``), under its lock.
        self._reader: pa.RecordBatchStreamReader | None = None
        self._opening = threading.Lock()
        self.feeders: list[_Feeder] = []
        fds: list[int] = []
        try:
            if op == "run":
                self.result_r, result_w = _pipe()
                fds.append(result_w)
            self.interrupt_r, self.interrupt_w = os.pipe()
            fds.append(self.interrupt_r)
            for open_ in plan.streams:
                r, w = _pipe()
                fds.append(r)
                self.feeders.append(_Feeder(open_, w))
            self.worker.ask(plan.request(op, batch_rows, scope), fds)
        except BaseException as e:
            _close(*fds)
            for f in self.feeders:
                _close(f.fd)
            self._finish(healthy=False)
            if isinstance(e, WorkerDied):
                raise self._died(e) from None
            raise
        _close(*fds)  # the worker has its own copies now
        for f in self.feeders:
            f.start()
        self.timer = DEADLINES.after(timeout_s, self.interrupt)

    def cancel(self) -> None:
        """The caller cancelled the statement: stop it; its stream ends with CANCELLED."""
        self.cancelled = True
        self.interrupt(timed_out=False)

    def interrupt(self, timed_out: bool = True) -> None:
        """Ask the worker to stop the statement; kill it if it has not within ``GRACE_S``."""
        self.timed_out = self.timed_out or timed_out
        with self._finishing:
            if self._done:  # its pipe is closed, and its descriptor may be another file's now
                return
            with contextlib.suppress(OSError):
                os.write(self.interrupt_w, b"x")
        killer = threading.Timer(GRACE_S, self._kill_unless_done)
        killer.daemon = True
        killer.start()

    def abandon(self) -> None:
        """Stop a statement whose result nobody will read (started early, no DoGet took it):
        its result pipe closed first (a worker writing to it stops), then its answer awaited
        and its worker given back."""
        self.cancel()
        with self._opening, self._finishing:
            if self.result_r is not None and not self._done:
                _close(self.result_r)
                self.result_r = None
        self._close_source()  # its reader, when its schema was read (``result_schema``)
        with contextlib.suppress(HarnessError):
            self.close()

    def _kill_unless_done(self) -> None:
        if not self._answered:
            log.warning("statement worker %d did not stop when asked: killed", self.worker.pid)
            self.worker.kill()

    def _died(self, e: BaseException) -> BaseException:
        if self.cancelled:
            return Cancelled("the statement was cancelled")
        if self.timed_out:
            return self.translate("interrupted", "")
        return ResourceExhausted(
            "the statement's worker process ended while it ran (its memory bound, "
            f"limits.sql_memory_limit_mb, or a crash): {e}"
        )

    def answer(self) -> dict[str, Any]:
        """The worker's answer; raises the error it reports."""
        try:
            message = self.worker.answer()
        except WorkerDied as e:
            self._answered = True
            self._finish(healthy=False)
            raise self._died(e) from None
        self._answered = True
        failed = next((f.error for f in self.feeders if f.error is not None), None)
        if "error" in message:
            self._finish(healthy=message["error"] not in ("memory", "internal"))
            if failed is not None:  # the source's own failure says more than DuckDB's
                raise _source_failure(failed)
            if self.cancelled:
                raise Cancelled("the statement was cancelled")
            kind = "interrupted" if self.timed_out else str(message["error"])
            raise self.translate(kind, str(message.get("message", "")))
        self._finish(healthy=True)
        if failed is not None:
            raise _source_failure(failed)
        return message

    def _finish(self, healthy: bool) -> None:
        with self._finishing:
            if self._done:
                return
            self._done = True
        if self.timer is not None:
            DEADLINES.cancel(self.timer)
        if self.result_r is not None:
            _close(self.result_r)
            self.result_r = None
        self._close_source()
        with self._finishing:
            _close(getattr(self, "interrupt_w", -1))
        for f in self.feeders:
            f.join(GRACE_S)
        self.pool.give_back(self.worker, healthy)

    def _close_source(self) -> None:
        source, self.source = self.source, None
        if source is not None:
            with contextlib.suppress(OSError, ValueError):
                source.close()

    def schema(self) -> pa.Schema:
        message = self.answer()
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(message["schema"])))

    def result_schema(self, wait_s: float) -> pa.Schema | None:
        """The schema of a running statement's result, as its worker sent it (the first
        message of its stream, sent once DuckDB has planned the query), if it came within
        ``wait_s``, else None. ``NoResult`` when it ended, or was stopped, without one (its
        answer says why). The stream goes on from there (``stream``)."""
        with self._opening:
            if self._reader is None:
                fd = self.result_r
                if fd is None or self._done:
                    raise NoResult("the statement was stopped")
                waiting = select.poll()  # not select(): a busy gateway's descriptors pass 1024
                waiting.register(fd, select.POLLIN)
                if not waiting.poll(wait_s * 1000):
                    return None
                try:
                    self._open()
                except (OSError, pa.ArrowInvalid) as e:
                    raise NoResult(str(e)) from None
            assert self._reader is not None
            return self._reader.schema

    def _open(self) -> pa.RecordBatchStreamReader:
        """The result's reader, opened once (under ``_opening``): it reads the schema."""
        if self._reader is None:
            if self.result_r is None:
                raise OSError("the statement's result was read already")
            source = os.fdopen(self.result_r, "rb", buffering=protocol.PIPE_BUFFER)
            self.result_r, self.source = None, source
            self._reader = pa.ipc.open_stream(source)
        return self._reader

    def stream(self) -> pa.RecordBatchReader:
        """The result as the worker produces it. Raises before returning when the statement
        fails before its first batch; a failure later ends the stream with that error."""
        try:
            with self._opening:
                reader = self._open()
        except (OSError, pa.ArrowInvalid):
            self.answer()  # the worker reports why it wrote nothing
            raise Unavailable("the statement ended without a result") from None
        except BaseException:
            self.interrupt(timed_out=False)
            self.close()
            raise

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                while True:
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        whole = True
                        break
                    except (OSError, pa.ArrowInvalid):
                        whole = False
                        break  # cut short: the worker's answer says why
                    yield batch
                if whole and not self.feeders:
                    self._give_back_unanswered()
                else:
                    self.answer()
            finally:
                if not self._answered:  # the caller went away: stop the statement
                    self.interrupt(timed_out=False)
                    self._close_source()
                    self.close()

        return pa.RecordBatchReader.from_batches(reader.schema, batches())

    def _give_back_unanswered(self) -> None:
        """The result ended whole (the worker writes the end-of-stream marker only then) and no
        source fed the statement (whose failure the answer would report): the answer can only
        say it succeeded, and is read when the worker is lent next (``Worker.settle``), off
        this statement's path (~0.2-0.5 ms of a tiny statement's)."""
        self._answered = True
        self.worker.unanswered = True
        self._finish(healthy=True)

    def close(self) -> None:
        if self._answered:
            self._finish(healthy=True)
            return
        with contextlib.suppress(HarnessError):
            self.answer()


def _source_failure(e: BaseException) -> BaseException:
    if isinstance(e, HarnessError):
        return e
    return Unavailable(f"a source of the statement could not be read: {e}")
