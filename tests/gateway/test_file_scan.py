"""A files source's many files scanned in runs of one schema (``planners.file_scan``): the
rows are DuckDB's over the same files, whatever the mix of schemas, filters or files replaced."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import Unavailable
from planners.common import coalesced
from tests.gateway.helpers import write_parquet

SCHEMA = [
    {"name": "id", "type": "int64"},
    {"name": "a", "type": "int64"},
    {"name": "c", "type": "string"},
]


def _narrow(first: int, n: int) -> pa.Table:
    """The early layout: ``a`` as int32, no ``c``."""
    ids = range(first, first + n)
    return pa.table(
        {"id": pa.array(ids, pa.int64()), "a": pa.array([i % 7 for i in ids], pa.int32())}
    )


def _wide(first: int, n: int) -> pa.Table:
    """The later layout: ``a`` int64 and ``c`` added, columns in another order."""
    ids = range(first, first + n)
    return pa.table({"c": [f"c{i}" for i in ids], "a": [i % 7 for i in ids], "id": list(ids)})


@pytest.fixture
def mixed(client: HarnessClient, tmp_path: Path) -> list[str]:
    """30 files alternating between two schemas in runs of 1-4, listed by one source."""
    root = tmp_path / "files"
    names, first = [], 0
    for i, run in enumerate([3, 1, 4, 2, 1, 1, 4, 3, 2, 1, 4, 4]):
        for _ in range(run):
            name = f"f{len(names):03d}.parquet"
            write_parquet(root / name, (_narrow if i % 2 == 0 else _wide)(first, 50))
            names.append(name)
            first += 50
    client.create_table("t", SCHEMA)
    client.commit("t", add_sources=[{
        "name": "files", "kind": "files", "config": {"root": str(root)},
        "state": {"files": names},
    }])  # fmt: skip
    return [str(root / n) for n in names]


def _duckdb(paths: list[str], where: str = "true") -> pa.Table:
    listed = ", ".join(f"'{p}'" for p in paths)
    return duckdb.sql(
        f"SELECT id, a::BIGINT AS a, c FROM read_parquet([{listed}], union_by_name = true) "
        f"WHERE {where} ORDER BY id"
    ).to_arrow_table()


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by("id").select(["id", "a", "c"])


@pytest.mark.parametrize(
    ("harness_filter", "duckdb_where"),
    [(None, "true"), ("a = 3", "a = 3"), ("c IS NULL AND id > 400", "c IS NULL AND id > 400")],
)
def test_rows_across_schemas_match_duckdb(
    client: HarnessClient, mixed: list[str], harness_filter: str | None, duckdb_where: str
) -> None:
    got = client.read("t", filter=harness_filter)
    want = _duckdb(mixed, duckdb_where)
    assert got.num_rows == want.num_rows > 0
    assert _sorted(got).to_pylist() == want.to_pylist()


def test_a_projection_keeps_the_order_of_the_list(client: HarnessClient, mixed: list[str]) -> None:
    ids = client.read("t", columns=["id"]).column("id").to_pylist()
    assert ids == list(range(len(mixed) * 50))  # one task: the files' order, row by row


def test_a_file_replaced_in_place_is_read_as_it_is_now(
    client: HarnessClient, mixed: list[str]
) -> None:
    client.read("t")  # every file's schema cached
    narrow = mixed[0]
    stat = os.stat(narrow)
    write_parquet(Path(narrow), _wide(0, 50))  # same ids, now with ``c``
    os.utime(narrow, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    got = client.read("t", filter="id < 50")
    assert got.column("c").to_pylist() == [f"c{i}" for i in range(50)]
    assert _sorted(client.read("t")).to_pylist() == _duckdb(mixed).to_pylist()


def test_a_missing_file_fails_the_read_unavailable(client: HarnessClient, mixed: list[str]) -> None:
    client.read("t")
    os.remove(mixed[17])
    with pytest.raises(Unavailable, match=r"f017\.parquet"):
        client.read("t")


def test_small_files_stream_in_few_batches(client: HarnessClient, mixed: list[str]) -> None:
    """30 files of 50 rows in 12 runs of a schema: one batch on the wire, not one per file
    (every layer after the scan pays per batch), with DuckDB's rows in the list's order."""
    info = client.flight_info("t")
    (endpoint,) = info.endpoints
    reader = fl.connect(client.uri).do_get(endpoint.ticket)
    batches = [chunk.data for chunk in reader]
    assert [b.num_rows for b in batches] == [len(mixed) * 50]
    got = pa.Table.from_batches(batches)
    assert got.column("id").to_pylist() == list(range(len(mixed) * 50))
    assert _sorted(got).to_pylist() == _duckdb(mixed).to_pylist()


def _batches(sizes: list[int], fail_after: int | None = None) -> pa.RecordBatchReader:
    schema = pa.schema([("x", pa.int64())])

    def gen():  # type: ignore[no-untyped-def]
        first = 0
        for i, n in enumerate(sizes):
            if i == fail_after:
                raise OSError("the source went away")
            yield pa.record_batch([pa.array(range(first, first + n), pa.int64())], schema=schema)
            first += n

    return pa.RecordBatchReader.from_batches(schema, gen())


def test_coalesced_joins_small_batches_up_to_the_bounds() -> None:
    out = list(coalesced(_batches([100] * 25 + [1000, 5]), rows=1000))
    assert [b.num_rows for b in out] == [1000, 1000, 1500, 5]
    assert pa.Table.from_batches(out).column("x").to_pylist() == list(range(3505))
    # a batch as big as the bound passes as it is; bytes bound too (8 bytes a row)
    assert [b.num_rows for b in coalesced(_batches([2000, 10]), rows=1000)] == [2000, 10]
    assert [b.num_rows for b in coalesced(_batches([100] * 4), max_bytes=1600)] == [200, 200]


def test_coalesced_raises_what_the_source_raised_not_a_short_stream() -> None:
    reader = coalesced(_batches([100] * 10, fail_after=5), rows=1000)
    with pytest.raises(OSError, match="went away"):
        reader.read_all()


def test_decoded_files_are_kept_within_their_bytes() -> None:
    """The small files' cache drops the least recently read past its bound, and never keeps
    rows that decode larger than a sixteenth of it."""
    from planners.file_scan import _Decoded

    kept = _Decoded(limit=16 * 8 * 100)  # sixteen 100-row int64 files
    reads: list[int] = []

    def read(n: int) -> pa.Table:
        reads.append(n)
        return pa.table({"x": pa.array(range(n * 100, n * 100 + 100), pa.int64())})

    key = lambda n: ("local", f"/f{n}", 1, 1)  # noqa: E731
    for n in range(20):
        assert kept.get(key(n), lambda n=n: read(n)).column("x")[0].as_py() == n * 100
    assert kept.get(key(19), lambda: read(-1)).num_rows == 100  # kept: not read again
    kept.get(key(0), lambda: read(0))  # dropped: read again
    assert reads == [*range(20), 0]
    big = pa.table({"x": pa.array(range(200), pa.int64())})
    kept.get(key(99), lambda: big)
    kept.get(key(99), lambda: big)
    assert ("local", "/f99", 1, 1) not in kept._tables


def test_a_file_is_decoded_once_by_concurrent_readers() -> None:
    """Readers of the same new file wait for the one decoding it; when it fails, each reads
    the file itself (and sees the failure itself)."""
    import threading
    import time

    from planners.file_scan import _Decoded

    kept = _Decoded(limit=1 << 20)
    reads: list[str] = []

    def slow() -> pa.Table:
        reads.append("read")
        time.sleep(0.2)
        return pa.table({"x": [1, 2, 3]})

    got: list[int] = []
    threads = [
        threading.Thread(target=lambda: got.append(kept.get(("local", "/a", 1, 1), slow).num_rows))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [3] * 8 and reads == ["read"]

    def failing() -> pa.Table:
        reads.append("failed")
        time.sleep(0.1)
        raise OSError("gone")

    errors: list[str] = []

    def one() -> None:
        try:
            kept.get(("local", "/b", 1, 1), failing)
        except OSError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == ["gone"] * 3 and reads.count("failed") == 3


def test_coalesced_closes_its_source_when_the_caller_drops_it_early() -> None:
    """As the Flight server does with a stream whose client went away: the source's own
    clean-up (connections back to their pools) runs then, not at the end of its rows."""
    schema = pa.schema([("x", pa.int64())])
    closed: list[bool] = []

    def gen():  # type: ignore[no-untyped-def]
        try:
            for i in range(10):
                yield pa.record_batch([pa.array([i] * 100, pa.int64())], schema=schema)
        finally:
            closed.append(True)

    out = coalesced(pa.RecordBatchReader.from_batches(schema, gen()), rows=200)
    assert out.read_next_batch().num_rows == 200
    out.close()
    del out
    assert closed == [True]
