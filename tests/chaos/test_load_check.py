"""The chaos load's read check (benchmarks.chaos_load.check_ids) finds what it must: a checker
that cannot fail would let the failover and load figures report 0 lost, 0 duplicated whatever
happened."""

import numpy as np
import pyarrow as pa

from benchmarks.chaos_load import Load, check_ids, lost_and_doubled


def ids(*chunks: list[int]) -> pa.ChunkedArray:
    return pa.chunked_array([pa.array(c, pa.int64()) for c in chunks], pa.int64())


def test_an_exact_read_passes_in_any_order_and_chunking() -> None:
    expected = np.arange(10, dtype=np.int64)
    assert check_ids(expected, ids([5, 6, 7, 8, 9], [0, 1, 2, 3, 4])) is None
    assert check_ids(np.array([], np.int64), pa.chunked_array([], pa.int64())) is None


def test_rows_written_after_the_read_began_may_appear() -> None:
    assert check_ids(np.arange(3, dtype=np.int64), ids([0, 1, 2, 3, 4])) is None


def test_duplicates_and_missing_rows_are_reported() -> None:
    expected = np.arange(5, dtype=np.int64)
    assert check_ids(expected, ids([0, 1, 2], [2, 3, 4])) == "1 rows twice"
    assert check_ids(expected, ids([0, 1, 4])) == "2 acknowledged rows missing"
    assert check_ids(expected, ids([0, 0, 1])) == "1 rows twice, 3 acknowledged rows missing"


def test_acknowledged_batches_expand_to_their_ids() -> None:
    load = Load(["grpc://127.0.0.1:1"], batch=3)
    load.firsts += [30, 0]
    assert load.acked_ids().tolist() == [0, 1, 2, 30, 31, 32]
    assert load.acked == {0, 1, 2, 30, 31, 32}
    assert load.acked_rows == 6


def test_a_window_counts_what_ended_within_it() -> None:
    load = Load(["grpc://127.0.0.1:1"])
    load.read_s += [1.0, 3.0, 5.0, 7.0]
    load.read_end += [10.0, 20.0, 30.0, 70.0]
    load.commit_end += [5.0, 15.0, 25.0, 35.0]
    assert load.window(10.0, 40.0) == {"read p50 s": 3.0, "reads/min": 6.0, "commits/s": 0.1}
    assert load.window(80.0, 90.0)["reads/min"] == 0.0


def test_counts_match_sets_on_random_reads() -> None:
    """Against plain Python sets and counts, over reads with rows missing, doubled, tripled
    and written after the read began."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        expected = np.unique(rng.integers(0, 500, rng.integers(0, 60)))
        read = [int(i) for i in expected if rng.random() > 0.1]
        read += [int(i) for i in rng.choice(read, rng.integers(0, 5))] if read else []
        read += [int(i) for i in rng.integers(500, 600, rng.integers(0, 5))]
        rng.shuffle(read)
        missing = len(set(expected.tolist()) - set(read))
        twice = len(read) - len(set(read))
        assert lost_and_doubled(expected, ids(read)) == (missing, twice)
