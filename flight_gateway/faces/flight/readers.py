"""The gateway's read processes (``read_processes = N`` in its config; 0, the default: none).

Measured under 64 readers and 16 writers on two cores (benchmarks/bench_chaos.py): with every
DoGet in the gateway's process, a writer's commit waited for the interpreter lock behind the
readers' Python (Kafka messages decoded one by one, dataset scans set up): a 3 ms read of the
table's state took 0.4 s, and commit p99 was 20 s. With the reads in another process the same
writers committed 4x as often at p99 1.8 s. So a DoGet's stream is opened in a read process
(``read_process``) and passed through: the gateway verifies the ticket, checks the caller's
grant and takes its stream slot as always, then relays the process's stream: batches are
decoded by pyarrow's Flight client in C++ and handed on by a generator (a few microseconds of
Python per batch), which is there to translate errors and to give the stream slot back when
the stream ends. Errors keep their status codes; a process that dies fails its streams with
UNAVAILABLE (the caller may send the read again; it is the gateway's own UNAVAILABLE, so a
client does not move to another replica for it) and is started again for the next read.

A read's plan (GetFlightInfo) is made in a read process too, after the gateway checked the
caller's grant (``plan``): plans at a new version each (an Iceberg snapshot's manifests, a
files listing) kept dozens of threads wanting the gateway's interpreter lock, and each of a
writer's round trips waited behind them. Under the same load, 60 s measured: 5.2 -> 28.2
commits/s, commit p99 10.8 -> 1.75 s (docs/operations.md, 2026-12-04, evening).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import pyarrow as pa
import pyarrow.flight as fl

from flight_gateway.core.config import GatewayConfig
from flight_gateway.faces.flight.read_process import READY, forwarded, forwarded_plan
from flight_gateway.protocol.errors import HarnessError, Unavailable
from flight_gateway.protocol.flight_errors import from_flight_error

log = logging.getLogger(__name__)
START_S = 120.0  # a process imports pyarrow, the kinds and the catalog before it is ready


@dataclass
class _Process:
    index: int
    socket: str
    popen: subprocess.Popen[bytes] | None = None
    client: fl.FlightClient | None = None
    streams: int = 0  # open now
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class ReadProcesses:
    """``count`` read processes for one gateway; ``open`` relays a verified ticket's stream
    from the one with the fewest open streams."""

    def __init__(self, catalog_url: str, config: GatewayConfig, count: int) -> None:
        if catalog_url.startswith("sqlite://") and (
            catalog_url in ("sqlite://", "sqlite:///:memory:") or "mode=memory" in catalog_url
        ):
            raise ValueError("read_processes needs a catalog other processes can open, not an "
                             "in-memory SQLite database")  # fmt: skip
        self._setup = pickle.dumps((catalog_url, config))
        self._dir = tempfile.mkdtemp(prefix="harness-reads-")  # 0700: only our user connects
        self._lock = threading.Lock()
        self._closed = False
        self._processes = [_Process(i, os.path.join(self._dir, f"r{i}.sock")) for i in range(count)]
        starting = [threading.Thread(target=self._start, args=(p,)) for p in self._processes]
        for t in starting:
            t.start()
        for t in starting:
            t.join()
        dead = [p.index for p in self._processes if not p.alive]
        if dead:
            self.close()
            raise RuntimeError(f"read processes {dead} did not start (see the log above)")

    # ------------------------------------------------------------------ processes

    def _start(self, p: _Process) -> None:
        if os.path.exists(p.socket):
            os.unlink(p.socket)
        popen = subprocess.Popen(
            [sys.executable, "-m", "flight_gateway.faces.flight.read_process", p.socket],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert popen.stdin is not None and popen.stdout is not None
        try:
            popen.stdin.write(len(self._setup).to_bytes(8, "big") + self._setup)
            popen.stdin.flush()  # kept open: the process exits when it closes
            ready = _read_line(popen.stdout, START_S)
        except OSError:
            ready = b""
        if ready != READY:
            log.error("read process %d did not start (exit %s)", p.index, popen.poll())
            _stop(popen)
            return
        # The client first: ``_pick`` reads ``alive`` (the process) without the lock.
        p.client = fl.FlightClient(f"grpc+unix://{p.socket}")
        p.popen = popen
        log.info("read process %d started (pid %d)", p.index, popen.pid)

    def _pick(self) -> _Process:
        with self._lock:
            if self._closed:
                raise Unavailable("the gateway is shutting down")
            p = min(self._processes, key=lambda q: q.streams)
            p.streams += 1
        # Checked before the lock too: every stream took it, and a holder preempted for the
        # interpreter lock inside it kept each stream of the process waiting (64 readers).
        if not p.alive:
            self._restart(p)
        if not p.alive:
            self._done(p)
            raise Unavailable("a read process could not be started: try again")
        return p

    def _restart(self, p: _Process) -> None:
        with p.lock:  # one restart at a time; the others wait for it
            if not p.alive:
                if p.popen is not None:
                    log.warning("read process %d exited (%s): starting it again", p.index,
                                p.popen.poll())  # fmt: skip
                    _stop(p.popen)
                    p.popen = None
                if p.client is not None:
                    p.client.close()
                    p.client = None
                self._start(p)

    def _done(self, p: _Process) -> None:
        with self._lock:
            p.streams -= 1

    # ------------------------------------------------------------------ reads

    def open(self, ticket: bytes, principal: str) -> pa.RecordBatchReader:
        """The stream of ``ticket`` (verified here already), read in a read process."""
        p = self._pick()
        try:
            client = p.client
            if client is None:  # restarted by another stream since this one picked it
                raise Unavailable("the read process is restarting: try again")
            stream = client.do_get(fl.Ticket(forwarded(ticket, principal)))
            reader = stream.to_reader()
            schema = reader.schema  # the first message: an error before any row raises here
        except (fl.FlightError, pa.ArrowException, OSError) as e:
            self._done(p)
            raise _harness_error(e, p) from None
        except BaseException:
            self._done(p)
            raise
        return pa.RecordBatchReader.from_batches(schema, self._relay(p, stream, reader))

    def plan(
        self, descriptor: fl.FlightDescriptor, principal: str, locations: list[Any]
    ) -> fl.FlightInfo:
        """A read planned in a read process (its grant checked here), with this gateway's
        ``locations``. Under 64 readers and 16 writers on two cores, plans made here (an
        Iceberg snapshot's manifests, a files source's listing, each read at a new version)
        kept dozens of threads wanting the gateway's interpreter lock, and a writer waited for
        it after each of its round trips to the catalog and the sources."""
        p = self._pick()
        try:
            client = p.client
            if client is None:  # restarted by another call since this one picked it
                raise Unavailable("the read process is restarting: try again")
            info = client.get_flight_info(forwarded_plan(descriptor, principal))
        except (fl.FlightError, pa.ArrowException, OSError) as e:
            raise _harness_error(e, p) from None
        finally:
            self._done(p)
        endpoints = [
            fl.FlightEndpoint(
                e.ticket, locations, expiration_time=e.expiration_time, app_metadata=e.app_metadata
            )
            for e in info.endpoints
        ]
        return fl.FlightInfo(info.schema, descriptor, endpoints, -1, -1,
                             app_metadata=info.app_metadata)  # fmt: skip

    def _relay(
        self, p: _Process, stream: fl.FlightStreamReader, reader: pa.RecordBatchReader
    ) -> Iterator[pa.RecordBatch]:
        ended = False
        try:
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    ended = True
                    return
                except (fl.FlightError, pa.ArrowException, OSError) as e:
                    ended = True
                    raise _harness_error(e, p) from None
                yield batch
        finally:
            if not ended:  # the caller went away: the read process stops reading too
                with contextlib.suppress(Exception):
                    stream.cancel()
            reader.close()
            self._done(p)

    def pids(self) -> list[int]:
        return [p.popen.pid for p in self._processes if p.popen is not None and p.alive]

    def close(self) -> None:
        with self._lock:
            self._closed = True
        for p in self._processes:
            if p.client is not None:
                p.client.close()
            if p.popen is not None:
                _stop(p.popen)
        shutil.rmtree(self._dir, ignore_errors=True)


def _harness_error(e: BaseException, p: _Process) -> BaseException:
    """A read process's error as the harness error it stands for; a lost process (its socket
    closed, a stream cut) is UNAVAILABLE: the read can be sent again."""
    if isinstance(e, HarnessError):
        return e
    if not p.alive or (_connection_lost(e) and _exiting(p)):
        log.warning("read process %d exited during a read: %s", p.index, e)
        return Unavailable("the read process serving this stream exited: send the read again")
    typed = from_flight_error(e) if isinstance(e, Exception) else e
    if isinstance(typed, HarnessError):
        return typed
    log.warning("read process stream failed: %s", e)
    return Unavailable(f"a read process failed: {type(e).__name__}: {e}")


#: How long a lost connection to a read process waits to see the process gone.
EXIT_WAIT_S = 1.0


def _connection_lost(e: BaseException) -> bool:
    """The transport's own UNAVAILABLE (a socket closed, a connection refused), not one the
    read process sent (a source or the catalog down: its message comes as sent)."""
    transport = isinstance(e, fl.FlightUnavailableError) and str(e).startswith(
        "Flight returned unavailable error"
    )
    return transport or isinstance(e, OSError)


def _exiting(p: _Process) -> bool:
    """Whether ``p``, its connection just lost, is exiting: a killed process's socket closes
    before the process can be waited for, and under load a stream saw the one before the other
    (then it failed as a plain UNAVAILABLE from the transport, not as the exited process)."""
    popen = p.popen  # a restart may replace it meanwhile
    if popen is None:
        return True
    try:
        popen.wait(timeout=EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        return False
    return True


def _read_line(stream: IO[bytes], timeout_s: float) -> bytes:
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return out[0] if out else b""


def _stop(popen: subprocess.Popen[bytes]) -> None:
    for pipe in (popen.stdin, popen.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    deadline = time.monotonic() + 5
    while popen.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if popen.poll() is None:
        popen.kill()
        popen.wait(5)
