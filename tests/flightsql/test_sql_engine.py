"""The statement engine: DuckDB scans the pinned sources itself, results stream, every statement
is bounded (time, memory and spill, stream slots), and the sandbox holds against SQL written to
break out of it. Real gateways, real Postgres, real clients on loopback."""

from __future__ import annotations

import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
import duckdb
import psycopg
import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest

from clients import HarnessClient
from flight_gateway.protocol.flightsql import pack, pb
from planners.postgres.cache import CACHE as PINNED_ROWS
from tests.gateway.helpers import DuckLakeFixture, client_for, running_gateway, versioned_table

pytestmark = pytest.mark.integration


def _statement(uri: str, sql: str) -> fl.FlightStreamReader:
    raw = fl.FlightClient(uri)
    info = raw.get_flight_info(
        fl.FlightDescriptor.for_command(pack(pb.CommandStatementQuery(query=sql)))
    )
    return raw.do_get(info.endpoints[0].ticket)


def _numbers(client: HarnessClient, root: Path, rows: int, name: str = "numbers") -> None:
    """``name``: ``rows`` rows of (i, s) in one Parquet file."""
    root.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    path = root / f"{name}.parquet"
    con.execute(
        f"COPY (SELECT i::BIGINT AS i, md5(i::VARCHAR) AS s FROM range({rows}) t(i)) TO '{path}'"
    )
    client.create_table(name, [{"name": "i", "type": "int64"}, {"name": "s", "type": "string"}])
    client.add_source(name, "f", "files", config={"root": str(root)}, state={"files": [path.name]})


@pytest.fixture
def bounded(tmp_path: Path):
    limits = {
        "sql_timeout_s": 2.0,
        "sql_memory_limit_mb": 64,
        "sql_spill_limit_mb": 8,
        "sql_threads": 2,
        "sql_temp_dir": str(tmp_path / "spill"),
        "max_streams_per_principal": 2,
    }
    (tmp_path / "spill").mkdir()
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", limits=limits) as (server, _):
        client = client_for(server)
        _numbers(client, tmp_path / "data", 300_000)
        yield server, client
        client.close()


def test_results_stream_in_batches_and_spill_directories_are_removed(
    bounded, tmp_path: Path
) -> None:
    _, client = bounded
    reader = _statement(client.uri, "SELECT i, s FROM numbers")
    batches = [chunk.data for chunk in reader]
    assert len(batches) > 1  # streamed as DuckDB produced them, not one materialised table
    assert sum(b.num_rows for b in batches) == 300_000
    assert list((tmp_path / "spill").iterdir()) == []


def test_a_statement_that_must_spill_does_and_its_spill_directory_goes(tmp_path: Path) -> None:
    """A self-join of 3 M strings at 256 MB spills (its database's own directory appears under
    ``sql_temp_dir``) and succeeds within the worker's bound; the directory goes with it."""
    spill = tmp_path / "spill"
    limits = {"sql_memory_limit_mb": 256, "sql_temp_dir": str(spill), "sql_threads": 2}
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", limits=limits) as (server, _):
        client = client_for(server)
        _numbers(client, tmp_path / "data", 3_000_000)
        seen: set[str] = set()
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                seen.update(p.name for p in spill.iterdir())
                time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        watcher.start()
        join = "SELECT count(*) AS n FROM numbers a JOIN numbers b ON a.s = b.s"
        try:
            assert _statement(client.uri, join).read_all().to_pylist() == [{"n": 3_000_000}]
        finally:
            done.set()
            watcher.join()
        assert seen and all(name.startswith("harness-sql-") for name in seen)
        # Its database closes right after its answer (it took over 50 ms), before the worker
        # takes another statement.
        deadline = time.monotonic() + 10
        while list(spill.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert list(spill.iterdir()) == []
        client.close()


def test_a_missing_temp_dir_is_made_at_start_and_statements_leave_nothing_in_it(
    tmp_path: Path,
) -> None:
    """``sql_temp_dir`` need not exist: the gateway makes it (DuckDB makes only a statement's
    own directory in it, on its first spill: ``test_worker_typing``), and statements leave
    nothing there."""
    spill = tmp_path / "not" / "yet"
    limits = {"sql_temp_dir": str(spill)}
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", limits=limits) as (server, _):
        client = client_for(server)
        assert spill.is_dir()
        _numbers(client, tmp_path / "data", 10_000)
        count = "SELECT count(*) AS n FROM numbers a JOIN numbers b ON a.s = b.s"
        assert _statement(client.uri, count).read_all().to_pylist() == [{"n": 10_000}]
        deadline = time.monotonic() + 10  # a quick statement's database closes after its answer
        while list(spill.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(spill.iterdir()) == []
        client.close()


def test_a_statement_past_its_time_fails_alone(bounded) -> None:
    _, client = bounded
    cross = "SELECT count(*) FROM numbers a, numbers b WHERE a.i + b.i = -1"
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _statement(client.uri, cross).read_all()
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    # Other callers are served meanwhile: a native read and another statement.
    assert client.read("numbers", columns=["i"]).num_rows == 300_000
    assert _statement(client.uri, "SELECT max(i) AS m FROM numbers").read_all().to_pylist() == [
        {"m": 299_999}
    ]
    thread.join(60)
    assert len(errors) == 1 and isinstance(errors[0], fl.FlightTimedOutError), errors
    assert "sql_timeout_s" in str(errors[0])


def test_a_statement_past_its_memory_and_spill_fails_alone(bounded, tmp_path: Path) -> None:
    _, client = bounded
    big = "SELECT a.s, b.s AS t FROM numbers a JOIN numbers b ON a.i % 1000 = b.i % 1000 ORDER BY 1, 2"
    with pytest.raises(fl.FlightServerError, match=r"RESOURCE_EXHAUSTED.*sql_memory_limit_mb"):
        _statement(client.uri, big).read_all()
    # It had spilled as far as it could; its worker was replaced and what it spilled removed.
    assert list((tmp_path / "spill").iterdir()) == []
    assert _statement(client.uri, "SELECT count(*) AS n FROM numbers").read_all().to_pylist() == [
        {"n": 300_000}
    ]


def test_each_running_statement_holds_a_stream_slot(tmp_path: Path) -> None:
    limits = {"max_streams_per_principal": 2}
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", limits=limits) as (server, _):
        client = client_for(server)
        _numbers(client, tmp_path / "data", 10_000)
        endless = "SELECT a.s, b.s AS t FROM numbers a, numbers b"  # 10^8 rows: still running
        running = [_statement(client.uri, endless) for _ in range(2)]
        for r in running:
            r.read_chunk()
        with pytest.raises(
            fl.FlightServerError, match=r"RESOURCE_EXHAUSTED.*max_streams_per_principal"
        ):
            _statement(client.uri, "SELECT 1 AS x FROM numbers").read_all()
        for r in running:
            r.cancel()  # the client goes away: the statement stops and frees its slot
        deadline = time.monotonic() + 30
        while True:
            try:
                out = _statement(client.uri, "SELECT count(*) AS n FROM numbers").read_all()
                break
            except fl.FlightServerError:
                assert time.monotonic() < deadline, "slots were not released"
                time.sleep(0.2)
        assert out.to_pylist() == [{"n": 10_000}]
        client.close()


def test_a_streamed_source_named_twice_or_in_a_cte_is_read_right(
    client: HarnessClient, ducklake: DuckLakeFixture
) -> None:
    """DuckLake is read through the harness stream (a stream can be scanned once): a table named
    twice, or through a CTE DuckDB may expand per use, still gives exact answers."""
    snap = ducklake.execute(
        "CREATE TABLE lake.t (id BIGINT, v VARCHAR)",
        "INSERT INTO lake.t SELECT i, 'v' || i FROM range(1000) r(i)",
    )
    client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "v", "type": "string"}])
    client.add_source(
        "t", "lake", "ducklake", config=ducklake.source_config("t"), state={"snapshot_id": snap}
    )
    with flightsql.connect(client.uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM t a JOIN t b ON a.id = b.id + 1")
        assert cur.fetchall() == [(999,)]
        cur.execute("WITH x AS (SELECT id FROM t) SELECT (SELECT count(*) FROM x), count(*) FROM x")
        assert cur.fetchall() == [(1000, 1000)]
        cur.execute("SELECT count(*) FROM t")
        assert cur.fetchall() == [(1000,)]


def test_versioned_postgres_is_scanned_at_its_pin(client: HarnessClient, pg_dsn: str) -> None:
    """The engine's Postgres scan reads the as-of state: rows changed after the pin do not
    show; NUMERIC stays exact; a filter pushed to the server returns the same rows."""
    name, as_of = versioned_table(
        pg_dsn,
        "sqlpg",
        "id bigint primary key, amount numeric(20,4), note text",
        "SELECT i, i * 1.0001, 'n''' || i FROM generate_series(1, 500) i",
    )
    client.create_table(
        "p",
        [
            {"name": "id", "type": "int64"},
            {"name": "amount", "type": "decimal128(20, 4)"},
            {"name": "note", "type": "string"},
        ],
    )
    client.add_source(
        "p", "pg", "postgres", config={"dsn": pg_dsn, "table": name}, state={"as_of": as_of}
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{name}" SET amount = 0 WHERE id <= 100')
        conn.execute(f'DELETE FROM "{name}" WHERE id > 400')
    with flightsql.connect(client.uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*), sum(amount) FROM p")
        ((count, total),) = cur.fetchall()
        assert count == 500  # the update and delete came after the pin
        assert total == sum(Decimal(i) * Decimal("1.0001") for i in range(1, 501))
        assert total == sum(r["amount"] for r in client.read("p").to_pylist())
        cur.execute(
            "SELECT id, note FROM p WHERE note = 'n''7' OR id BETWEEN 10 AND 12 ORDER BY id"
        )
        assert cur.fetchall() == [(7, "n'7"), (10, "n'10"), (11, "n'11"), (12, "n'12")]


SECRET = "pw-" + uuid.uuid4().hex


def test_postgres_credentials_never_reach_the_caller(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DSN (with a password from a secret) is used inside the gateway only: a statement
    failing on that server reports the failure without it."""
    monkeypatch.setenv("HARNESS_SECRET_SQLPG", SECRET)
    name, as_of = versioned_table(pg_dsn, "sqlsecret", "id bigint")
    dsn = pg_dsn + ("&" if "?" in pg_dsn else "?") + "password=${HARNESS_SECRET_SQLPG}"
    with running_gateway(
        f"sqlite:///{tmp_path / 'c.db'}", secrets={"allow": ["HARNESS_SECRET_SQLPG"]}
    ) as (server, _):
        client = client_for(server)
        client.create_table("s", [{"name": "id", "type": "int64"}])
        client.add_source(
            "s", "pg", "postgres", config={"dsn": dsn, "table": name}, state={"as_of": as_of}
        )
        # Read natively first: a statement would make the pinned rows slices, and the next
        # statement would read those instead of the server.
        assert client.read("s").num_rows == 0
        # Nor the rows that read kept (planners.postgres.cache): the statement must reach the
        # server to fail there.
        PINNED_ROWS.clear()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'ALTER TABLE "{name}_history" RENAME TO "{name}_gone"')
        try:
            with pytest.raises(fl.FlightUnavailableError) as caught:
                _statement(client.uri, "SELECT count(*) AS n FROM s").read_all()
        finally:  # other versioned tables of the schema share the session database
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute(f'ALTER TABLE "{name}_gone" RENAME TO "{name}_history"')
        assert SECRET not in str(caught.value) and "does not exist" in str(caught.value)
        client.close()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_parquet('/etc/passwd')",
        "SELECT * FROM '/etc/passwd'",
        "SELECT * FROM \"read_parquet\"('/etc/passwd')",
        "SELECT * FROM postgres_scan('host=127.0.0.1', 'public', 'x')",
        "SELECT * FROM postgres_query('__pg_0', 'SELECT 1')",
        "SELECT * FROM __harness_0",
        "SELECT * FROM __pg_0.public.pg_class",
        "SELECT * FROM __stream_0",
        "ATTACH 'x.db' AS x",
        "COPY numbers TO '/tmp/harness-escape.csv'",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SELECT getenv('HOME') FROM numbers",
        "SELECT i FROM numbers; ATTACH 'x.db' AS x",
        "SELECT i FROM numbers /* ; */ ; COPY numbers TO '/tmp/x.csv'",
        "WITH x AS (SELECT * FROM read_csv('/etc/passwd')) SELECT * FROM x",
        "SELECT (SELECT count(*) FROM read_text('/etc/passwd')) FROM numbers",
        "CREATE VIEW v AS SELECT * FROM read_text('/etc/passwd')",
        "SELECT * FROM numbers, LATERAL (SELECT * FROM glob('/etc/*'))",
        # A CTE name in one scope must not hide a catalog name in another (review finding).
        "SELECT d.path FROM (WITH duckdb_databases AS (SELECT 1 AS x) SELECT x FROM "
        "duckdb_databases) q, duckdb_databases d, numbers",
        "SELECT p.* FROM (WITH pragma_database_list AS (SELECT 1 AS x) SELECT x FROM "
        "pragma_database_list) q, pragma_database_list p, numbers",
        "SELECT s.value FROM (WITH pg_settings AS (SELECT 1 AS x) SELECT x FROM pg_settings) q, "
        "pg_settings s, numbers",
        "WITH x AS (SELECT * FROM duckdb_tables) SELECT * FROM x, numbers",
        "WITH __harness_0 AS (SELECT 1 AS i) SELECT * FROM __harness_0, numbers",
        "SELECT count(*) FROM numbers WHERE s = 'a\\'' OR s = 'b''c'",
    ],
)
def test_the_sandbox_holds(bounded, sql: str) -> None:
    _, client = bounded
    with pytest.raises((pa.ArrowInvalid, pa.ArrowKeyError, fl.FlightServerError)) as caught:
        _statement(client.uri, sql).read_all()
    assert not isinstance(caught.value, fl.FlightInternalError)
    assert "root:" not in str(caught.value)
    assert not Path("/tmp/harness-escape.csv").exists()
    assert client.read("numbers", columns=["i"]).num_rows == 300_000


def test_bound_parameters_stay_values(bounded) -> None:
    _, client = bounded
    with flightsql.connect(client.uri, autocommit=True) as conn, conn.cursor() as cur:
        evil = "x'; ATTACH 'y.db' AS y; --"
        cur.execute("SELECT count(*) FROM numbers WHERE s = ?", parameters=(evil,))
        assert cur.fetchall() == [(0,)]


def test_getting_the_schema_never_runs_the_statement(bounded) -> None:
    """GetFlightInfo types the result without running it (it used to run the whole query
    without a time limit); DoGet then stops at the statement timeout."""
    _, client = bounded
    heavy = (
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 300000000) "
        "SELECT (SELECT count(*) FROM r) AS c, count(*) AS k FROM numbers"
    )
    raw = fl.FlightClient(client.uri)
    command = pack(pb.CommandStatementQuery(query=heavy))
    info = raw.get_flight_info(fl.FlightDescriptor.for_command(command))
    assert info.schema.names == ["c", "k"]
    with pytest.raises(fl.FlightTimedOutError):
        raw.do_get(info.endpoints[0].ticket).read_all()


def test_file_names_with_pattern_characters_read_only_the_pinned_file(
    client: HarnessClient, tmp_path: Path
) -> None:
    pq.write_table(pa.table({"v": ["pinned"]}), tmp_path / "part[1].parquet")
    pq.write_table(pa.table({"v": ["not pinned"]}), tmp_path / "part1.parquet")
    client.create_table("g", [{"name": "v", "type": "string"}])
    client.add_source(
        "g", "f", "files", config={"root": str(tmp_path)}, state={"files": ["part[1].parquet"]}
    )
    assert _statement(client.uri, "SELECT v FROM g").read_all().to_pylist() == [{"v": "pinned"}]


def test_column_names_match_as_duckdb_matches_them(bounded) -> None:
    _, client = bounded
    with flightsql.connect(client.uri, autocommit=True) as conn, conn.cursor() as cur:
        for sql, expected in (
            ("SELECT max(I) FROM numbers", [(299_999,)]),
            ("SELECT max(N.i) FROM numbers n", [(299_999,)]),
            ("SELECT count(*) FROM numbers a JOIN numbers b USING (i) WHERE a.i < 10", [(10,)]),
            ("SELECT max(COLUMNS('i')) FROM numbers", [(299_999,)]),
            ("SELECT count(n) FROM numbers n WHERE n.i < 5", [(5,)]),
        ):
            cur.execute(sql)
            assert cur.fetchall() == expected, sql


def test_parameters_keep_their_types(bounded) -> None:
    import datetime

    _, client = bounded
    when = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    with flightsql.connect(client.uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT ? AS t, ? AS d, count(*) AS n FROM numbers WHERE i < ?",
            parameters=(when, Decimal("1.25"), 3),
        )
        row = cur.fetch_arrow_table().to_pylist()[0]
    assert row["t"] == when and row["d"] == Decimal("1.25") and row["n"] == 3
