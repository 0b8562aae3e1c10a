"""A slice's batches are read ahead by a thread of their own while the ones before are written
(``core.layout.prefetch``): the same batches in the same order, a reader's error raised where
its batch would have been, and a writer that stops early stops the reading and closes the
reader it was in."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest

from flight_gateway.core.layout import prefetch


def _reader(start: int, n: int) -> pa.RecordBatchReader:
    batches = [pa.record_batch({"i": list(range(start + k * 10, start + k * 10 + 10))})
               for k in range(n)]  # fmt: skip
    return pa.RecordBatchReader.from_batches(batches[0].schema, batches)


def test_every_batch_of_every_reader_in_order() -> None:
    got = [b.column("i").to_pylist() for b in prefetch.prefetched([_reader(0, 7), _reader(70, 5)])]
    assert [i for b in got for i in b] == list(range(120))


def test_a_readers_error_is_raised_after_the_batches_before_it() -> None:
    def failing() -> Iterator[pa.RecordBatch]:
        yield pa.record_batch({"i": [1]})
        raise OSError("server closed the connection")

    seen = []
    with pytest.raises(OSError, match="server closed"):
        for batch in prefetch.prefetched([failing()]):
            seen.append(batch.num_rows)
    assert seen == [1]


def test_stopping_early_stops_the_reading_and_closes_its_reader() -> None:
    closed = threading.Event()
    read = []

    def endless() -> Iterator[pa.RecordBatch]:
        try:
            n = 0
            while True:
                read.append(n)
                yield pa.record_batch({"i": [n]})
                n += 1
        finally:
            closed.set()

    batches = prefetch.prefetched([endless()])
    assert next(batches).num_rows == 1
    batches.close()  # the writer failed, say
    assert closed.is_set()  # closed before close() returned: the thread was joined
    assert len(read) <= prefetch.DEPTH + 3
    assert not [t for t in threading.enumerate() if t.name == "slice-read"]


def test_two_ways_read_every_batch_once_each_reader_in_order() -> None:
    readers = [_reader(k * 100, 9) for k in range(5)]
    got = [b.column("i").to_pylist() for b in prefetch.prefetched(readers, ways=2)]
    values = [i for b in got for i in b]
    assert sorted(values) == sorted(i for k in range(5) for i in range(k * 100, k * 100 + 90))
    for k in range(5):  # interleaved with the other thread's, but each reader's in order
        own = [i for i in values if k * 100 <= i < k * 100 + 90]
        assert own == sorted(own)
    assert not [t for t in threading.enumerate() if t.name == "slice-read"]


def test_two_ways_an_error_stops_both_and_closes_the_other_reader() -> None:
    closed = threading.Event()

    def endless() -> Iterator[pa.RecordBatch]:
        try:
            while True:
                yield pa.record_batch({"i": [0]})
        finally:
            closed.set()

    def failing() -> Iterator[pa.RecordBatch]:
        yield pa.record_batch({"i": [1]})
        raise OSError("server closed the connection")

    with pytest.raises(OSError, match="server closed"):
        for _ in prefetch.prefetched([endless(), failing()], ways=2):
            pass
    assert closed.is_set()
    assert not [t for t in threading.enumerate() if t.name == "slice-read"]
