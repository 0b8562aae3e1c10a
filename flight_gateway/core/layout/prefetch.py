"""Batches read ahead by threads of their own while the caller writes the ones before.

Making a slice reads a source (PostgreSQL's binary COPY decoded to Arrow by ADBC, Kafka
messages) and writes Parquet (encoding, compression): both run in native code outside the
GIL, and done one after the other a slice took their sum. Measured before this (TPC-H SF 1,
the PostgreSQL quarter of lineitem, 1.5 M rows, first statement at a version): 9.5 s to slice
three PostgreSQL sources, 3.0 s of it writing Parquet and the rest reading. A source of
several tasks is read by more than one thread (``ways``): each task's server side (a COPY)
then runs beside the other's.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

#: Batches read ahead of the writer at most (each one batch of the source's reader).
DEPTH = 4
_POLL_S = 0.1
JOIN_S = 10.0
log = logging.getLogger(__name__)


class _End:
    pass


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def prefetched(
    readers: Iterable[Iterable[pa.RecordBatch]], ways: int = 1
) -> Iterator[pa.RecordBatch]:
    """Every batch of each of ``readers``, read by ``ways`` threads up to ``DEPTH`` batches
    each ahead: with one, in order; with more, each thread takes the next reader when it is
    done with its own, so their batches interleave (a slice's rows have no order to keep).
    A reader's error is raised here, where its batch would have been; a caller that stops
    early (its own error, or closing this) stops the threads after the batch each is
    reading, and the readers they were in are closed."""
    ways = max(1, ways)
    ahead: queue.Queue[Any] = queue.Queue(DEPTH * ways)
    stop = threading.Event()
    source = iter(readers)
    taking = threading.Lock()  # a generator of readers is not for two threads at once

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ahead.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def next_reader() -> Iterable[pa.RecordBatch] | None:
        with taking:
            return None if stop.is_set() else next(source, None)

    def read() -> None:
        try:
            while (reader := next_reader()) is not None:
                try:
                    for batch in reader:
                        if not put(batch):
                            return
                finally:
                    close = getattr(reader, "close", None)
                    if stop.is_set() and close is not None:
                        with contextlib.suppress(Exception):
                            close()
        except BaseException as e:
            put(_Failed(e))
        else:
            put(_End())

    ctx = contextvars.copy_context()  # the caller's trace, for spans the readers open
    threads = [
        threading.Thread(target=ctx.copy().run, args=(read,), daemon=True, name="slice-read")
        for _ in range(ways)
    ]
    for thread in threads:
        thread.start()
    try:
        ended = 0
        while ended < len(threads):
            item = ahead.get()
            if isinstance(item, _End):
                ended += 1
                continue
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        # Each stops after the batch it is reading; a source stuck in a read does not hold
        # the caller past this (its thread ends, closing its reader, when the read returns).
        deadline = time.monotonic() + JOIN_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in threads):
            log.warning(
                "a slice's source is still in a read %.0f s after its writer stopped", JOIN_S
            )
