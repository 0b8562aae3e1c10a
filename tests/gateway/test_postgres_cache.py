"""Pinned rows of versioned Postgres tables kept between reads (``planners.postgres.cache``), on a
real server: a read at a newer ``as_of`` asks only for the rows written since, falls back to all
rows when a row version was closed meanwhile, and returns what a read without the cache does."""

from __future__ import annotations

import datetime as dt
import gc
from collections.abc import Iterator

import psycopg
import pyarrow as pa
import pytest

from clients import HarnessClient
from planners.postgres.cache import CACHE, PinnedCache, PinnedRows, kept
from planners.postgres.versioning import server_now
from tests.gateway.helpers import versioned_table

pytestmark = pytest.mark.integration
SCHEMA = [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}]


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    CACHE.clear()
    yield
    CACHE.clear()


def _counts(table: str) -> tuple[int, int, int]:
    """(reads served whole, extended by rows written since, read again) of ``table``."""
    mine = [k for k in {*CACHE.hits, *CACHE.extended, *CACHE.misses} if f'"{table}"/' in k]
    return tuple(sum(c[k] for k in mine) for c in (CACHE.hits, CACHE.extended, CACHE.misses))


def _uncached(client: HarnessClient, **read: object) -> pa.Table:
    """The same read with the cache emptied first: every pinned row from the server."""
    CACHE.clear()
    return client.read("t", **read)


def _write(dsn: str, *statements: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)
        return server_now(conn)


def _table(client: HarnessClient, dsn: str) -> tuple[str, int]:
    """(the Postgres table of 100 rows, the version pinning them)."""
    fill = "SELECT g, 'n' || g FROM generate_series(1, 100) g"
    name, as_of = versioned_table(dsn, "cached", "id bigint PRIMARY KEY, name text", fill)
    client.create_table("t", SCHEMA)
    version = client.add_source("t", "pg", "postgres", config={"dsn": dsn, "table": name},
                                state={"as_of": as_of})  # fmt: skip
    return name, version


def _pin(client: HarnessClient, as_of: str) -> int:
    return client.commit("t", updates=[{"source": "pg", "state": {"as_of": as_of}}])


def test_a_growing_table_is_read_once(client: HarnessClient, pg_dsn: str) -> None:
    name, v1 = _table(client, pg_dsn)
    assert client.read("t").num_rows == 100
    assert _counts(name) == (0, 0, 1)

    v2 = _pin(client, _write(pg_dsn, f"INSERT INTO \"{name}\" SELECT g, 'm' || g "
                                     "FROM generate_series(101, 150) g"))  # fmt: skip
    got = client.read("t").sort_by("id")
    assert _counts(name) == (0, 1, 1)  # the 50 new rows asked for, the 100 kept
    assert client.read("t", version=v1).num_rows == 100  # the older instant, kept too
    assert client.read("t", version=v2).sort_by("id").equals(got)
    assert _counts(name) == (2, 1, 1)
    assert got.equals(_uncached(client, version=v2).sort_by("id"))
    assert got.num_rows == 150 and got.column("name")[149].as_py() == "m150"


def test_a_closed_row_version_reads_everything_again(client: HarnessClient, pg_dsn: str) -> None:
    name, _ = _table(client, pg_dsn)
    client.read("t")
    _pin(client, _write(pg_dsn, f"UPDATE \"{name}\" SET name = 'changed' WHERE id <= 10",
                        f"INSERT INTO \"{name}\" VALUES (500, 'new')"))  # fmt: skip
    got = client.read("t").sort_by("id")
    assert _counts(name) == (0, 0, 2)
    assert got.column("name").to_pylist()[:11] == ["changed"] * 10 + ["n11"]
    assert got.equals(_uncached(client).sort_by("id"))

    v = _pin(client, _write(pg_dsn, f'DELETE FROM "{name}" WHERE id > 90 AND id <= 100'))
    deleted = client.read("t", version=v)
    assert _counts(name) == (0, 0, 2)  # the earlier counts were cleared by _uncached
    assert deleted.num_rows == 91 and 95 not in deleted.column("id").to_pylist()


def test_filters_and_columns_are_kept_apart(client: HarnessClient, pg_dsn: str) -> None:
    name, _ = _table(client, pg_dsn)
    reads = [
        {"columns": ["id"]},
        {"filter": "id > 90"},
        {"filter": "name LIKE 'm%'", "columns": ["name"]},
    ]
    for read in reads:
        client.read("t", **read)
    _pin(client, _write(pg_dsn, f"INSERT INTO \"{name}\" SELECT g, 'm' || g "
                                "FROM generate_series(101, 120) g"))  # fmt: skip
    got = [client.read("t", **read) for read in reads]
    assert _counts(name) == (0, 3, 3)
    assert [t.num_rows for t in got] == [120, 30, 20]
    for read, table in zip(reads, got, strict=True):
        assert table.sort_by(table.column_names[0]).equals(
            _uncached(client, **read).sort_by(table.column_names[0])
        )


def test_bounds() -> None:
    cache = PinnedCache(max_bytes=4 << 20)
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = pa.table({"x": pa.array(range(100_000), pa.int64())})  # 0.8 MB
    for i in range(6):  # a key keeps its newest few instants
        cache.add("a", PinnedRows(at + dt.timedelta(seconds=i), str(i), rows))
    kept_at = [cache.before("a", at + dt.timedelta(seconds=i)) for i in range(6)]
    assert [p.at if p else None for p in kept_at] == [None, None, "2", "3", "4", "5"]
    for i in range(6):  # other keys push the least recently used out
        cache.add(f"k{i}", PinnedRows(at, "0", rows))
    assert cache.before("a", at + dt.timedelta(seconds=9)) is None
    assert cache.before("k5", at) is not None
    big = pa.table({"x": pa.array(range(200_000), pa.int64())})  # over a quarter
    cache.add("big", PinnedRows(at, "0", big))
    assert cache.before("big", at) is None


def test_one_read_per_key_keeps_rows_and_only_when_read_whole() -> None:
    cache = PinnedCache()
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = pa.table({"x": list(range(10))})

    def reader() -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches(max_chunksize=3))

    first, second = kept(reader(), "k", at, "a", cache), kept(reader(), "k", at, "a", cache)
    assert second.read_all().equals(rows)  # streamed, not kept: the first is filling
    first.read_next_batch()
    del first  # dropped early (the stream was cancelled): nothing kept
    gc.collect()
    assert cache.before("k", at) is None
    assert kept(reader(), "k", at, "a", cache).read_all().equals(rows)
    hit = cache.before("k", at)
    assert hit is not None and hit.rows.equals(rows)


def test_rows_written_since_stream_after_the_kept_ones() -> None:
    """An extended read streams the rows written since (never whole in memory) after the kept
    ones, and keeps them all as the newer instant."""
    cache = PinnedCache()
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    base = pa.table({"x": list(range(10))})
    since = pa.table({"x": list(range(10, 25))})
    reader = pa.RecordBatchReader.from_batches(since.schema, since.to_batches(max_chunksize=4))
    later = at + dt.timedelta(seconds=1)
    got = kept(reader, "k", later, "b", cache, base=base).read_all()
    assert got.column("x").to_pylist() == list(range(25))
    hit = cache.before("k", later)
    assert hit is not None and hit.at == "b" and hit.rows.equals(got)
    other = pa.RecordBatchReader.from_batches(
        pa.schema([("x", pa.string())]), [pa.record_batch({"x": ["a"]})]
    )
    with pytest.raises(ValueError, match="came as"):
        kept(other, "k", later, "b", cache, base=base)


def test_a_table_created_again_or_truncated_keeps_nothing_of_before(
    client: HarnessClient, pg_dsn: str
) -> None:
    """DROP + CREATE under the same name, and TRUNCATE, leave no history: the kept rows are
    keyed by the table's oid and file node, so the next read asks for everything."""
    name, _ = _table(client, pg_dsn)
    assert client.read("t").num_rows == 100
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP TABLE "{name}", "{name}_history"')
    # The same name, versioned again, with other rows.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{name}" (id bigint PRIMARY KEY, name text)')
        from planners.postgres.versioning import enable_versioning

        enable_versioning(conn, name)
    _pin(client, _write(pg_dsn, f"INSERT INTO \"{name}\" VALUES (7, 'again')"))
    assert client.read("t").column("id").to_pylist() == [7]
    assert _counts(name) == (0, 0, 2)

    _pin(client, _write(pg_dsn, f'TRUNCATE "{name}"', f"INSERT INTO \"{name}\" VALUES (8, 'x')"))
    assert client.read("t").column("id").to_pylist() == [8]
    assert _counts(name) == (0, 0, 3)
