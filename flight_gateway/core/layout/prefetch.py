"""Batches read ahead by a thread of their own while the caller writes the ones before.

Making a slice reads a source (PostgreSQL's binary COPY decoded to Arrow by ADBC, Kafka
messages) and writes Parquet (encoding, zstd): both run in native code outside the GIL, and
done one after the other a slice took their sum. Measured before this (TPC-H SF 1, the
PostgreSQL quarter of lineitem, 1.5 M rows, first statement at a version): 9.5 s to slice
three PostgreSQL sources, 3.0 s of it writing Parquet and the rest reading.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import queue
import threading
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


def prefetched(readers: Iterable[Iterable[pa.RecordBatch]]) -> Iterator[pa.RecordBatch]:
    """Every batch of each of ``readers`` in order, read by a thread up to ``DEPTH`` batches
    ahead. A reader's error is raised here, where its batch would have been; a caller that
    stops early (its own error, or closing this) stops the thread after the batch it is
    reading, and the reader it was in is closed."""
    ahead: queue.Queue[Any] = queue.Queue(DEPTH)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ahead.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for reader in readers:
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
    thread = threading.Thread(target=ctx.run, args=(read,), daemon=True, name="slice-read")
    thread.start()
    try:
        while True:
            item = ahead.get()
            if isinstance(item, _End):
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        # It stops after the batch it is reading; a source stuck in a read does not hold the
        # caller past this (the thread ends, closing its reader, when the read returns).
        thread.join(JOIN_S)
        if thread.is_alive():
            log.warning(
                "a slice's source is still in a read %.0f s after its writer stopped", JOIN_S
            )
