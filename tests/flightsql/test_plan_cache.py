"""What statements reuse of a pinned version (DESIGN §17): result types and planned tables are
cached per version (hit rates counted), and a versioned PostgreSQL source read by a second
statement at the same version is read from Parquet slices made once; the rows stay those of the
pinned version, equal to the first statement's (read from PostgreSQL) and to the native read,
while PostgreSQL changes underneath."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import duckdb
import psycopg
import pytest

from planners.kind import ParquetScan
from planners.postgres.versioning import server_now
from tests.gateway.helpers import client_for, running_gateway
from tests.rest.helpers import versioned_pg_table

pytestmark = pytest.mark.integration
COLUMNS = [{"name": "id", "type": "int64"}, {"name": "region", "type": "string"}]


@pytest.fixture
def gateway(tmp_path: Path, pg_dsn: str) -> Iterator[tuple[Any, Any, str]]:
    reach = {"paths": [str(tmp_path)], "hosts": ["127.0.0.1", "localhost"]}
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", reach=reach,
                         iceberg_rest_dir=str(tmp_path / "slices")) as (server, _):  # fmt: skip
        client = client_for(server)
        name, as_of = versioned_pg_table(
            pg_dsn, "SELECT i, 'r' || (i % 3) FROM generate_series(1, 500) i"
        )
        client.create_table("t", COLUMNS)
        client.add_source("t", "pg", "postgres", config={"dsn": pg_dsn, "table": name},
                          state={"as_of": as_of})  # fmt: skip
        yield server, client, name
        client.close()


def _files_table(client: Any, tmp_path: Path, name: str, rows: str) -> None:
    """Table ``name`` over one Parquet file of DuckDB's ``rows`` in its own directory."""
    (tmp_path / name).mkdir()
    duckdb.connect().execute(f"COPY ({rows}) TO '{tmp_path / name / '0.parquet'}'")
    client.create_table(name, COLUMNS)
    client.add_source(name, "f", "files", config={"root": str(tmp_path / name)},
                      state={"files": ["0.parquet"]})  # fmt: skip


def _rows(uri: str, sql: str) -> list[tuple]:
    with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return sorted(cur.fetchall())


def test_a_pinned_postgres_source_is_read_once_then_from_slices(
    gateway: tuple[Any, Any, str], pg_dsn: str
) -> None:
    server, client, name = gateway
    version = client.describe("t").version
    sql = f"SELECT region, count(*), sum(id) FROM t FOR VERSION AS OF {version} GROUP BY region"
    first = _rows(client.uri, sql)  # planned, read from PostgreSQL
    native = client.read("t", version=version).to_pandas()
    assert first == sorted(
        (r, int(g["id"].count()), int(g["id"].sum())) for r, g in native.groupby("region")
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # PostgreSQL moves on
        conn.execute(f'DELETE FROM "{name}" WHERE id <= 100')
        conn.execute(f"INSERT INTO \"{name}\" VALUES (9999, 'new')")
    # Other texts of the same statement: the same text's result is kept (test_results.py)
    second = _rows(client.uri, sql.replace("sum(id)", "sum(id + 0)"))  # slices made now
    third = _rows(client.uri, sql.replace("sum(id)", "sum(id * 1)"))  # from the slices
    assert first == second == third
    rels = server.sql.relations
    cached = [v for v, _ in rels._items.values() if v.version == version]
    assert cached and all(isinstance(p.scan, ParquetScan) for p in cached[0].parts)
    assert all(Path(f).is_file() for p in cached[0].parts for f in p.scan.files)
    assert rels.stats()["hits"] >= 2
    assert server.sql.types.stats()["hits"] >= 2  # typed once for all three


def test_a_new_version_is_planned_again(gateway: tuple[Any, Any, str], pg_dsn: str) -> None:
    server, client, name = gateway
    sql = "SELECT count(*) FROM t"
    assert _rows(client.uri, sql) == [(500,)]
    assert _rows(client.uri, sql) == [(500,)]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO \"{name}\" VALUES (10001, 'x'), (10002, 'y')")
        as_of = server_now(conn)
    client.commit("t", updates=[{"source": "pg", "state": {"as_of": as_of}}])
    assert _rows(client.uri, sql) == [(502,)]
    # Per version: the table planned whole, then narrowed to the statement's columns.
    assert server.sql.relations.stats()["misses"] == 4


def test_a_statement_over_several_tables_pins_them_from_the_cached_descriptions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tables named together are pinned at one moment of the catalog's clock; that moment's
    version comes with the table's head, so a repeated statement reads no description again,
    and a commit in between is seen by the next statement (the pin moves, the rows with it)."""
    import duckdb

    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}") as (server, _):
        client = client_for(server)
        for t in ("a", "b"):
            _files_table(
                client, tmp_path, t, "SELECT i::BIGINT AS id, 'r' AS region FROM range(10) t(i)"
            )
        sql = "SELECT count(*) FROM a JOIN b ON a.id = b.id"
        assert _rows(client.uri, sql) == [(10,)]
        described: list[tuple[str, Any]] = []
        catalog = server.core.catalog
        real, real_at = catalog.describe, catalog.describe_at

        def counted(name: str, version: Any = None, as_of: Any = None) -> Any:
            described.append((name, version))
            return real(name, version, as_of)

        def counted_at(name: str, table_id: int, version: int) -> Any:
            described.append((name, version))  # how versions are pinned (one statement)
            return real_at(name, table_id, version)

        monkeypatch.setattr(catalog, "describe", counted)
        monkeypatch.setattr(catalog, "describe_at", counted_at)
        assert _rows(client.uri, sql) == [(10,)]
        assert described == []
        duckdb.connect().execute(
            f"COPY (SELECT i::BIGINT AS id, 'r' AS region FROM range(10, 15) t(i)) "
            f"TO '{tmp_path / 'b' / '1.parquet'}'"
        )
        client.commit("b",
                      updates=[{"source": "f", "state": {"files": ["0.parquet", "1.parquet"]}}])  # fmt: skip
        assert _rows(client.uri, "SELECT count(*) FROM a, b") == [(150,)]
        assert ("b", client.describe("b").version) in described
        client.close()


def test_a_repeated_statement_is_parsed_and_prepared_once(tmp_path: Path) -> None:
    """The second run of a statement finds its parse and its per-reference columns and filters
    cached (``parsed``, ``prepared``), with the same rows."""
    import duckdb

    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}") as (server, _):
        client = client_for(server)
        duckdb.connect().execute(
            f"COPY (SELECT i::BIGINT AS id, 'r' || (i % 3) AS region FROM range(30) t(i)) "
            f"TO '{tmp_path / '0.parquet'}'"
        )
        client.create_table("t", COLUMNS)
        client.add_source("t", "f", "files", config={"root": str(tmp_path)},
                          state={"files": ["0.parquet"]})  # fmt: skip
        sql = "SELECT region, count(*) FROM t WHERE id > 5 GROUP BY region"
        sql_service = server.sql
        first = _rows(client.uri, sql)
        before = {n: getattr(sql_service, n).stats() for n in ("parsed", "prepared")}
        assert _rows(client.uri, sql) == first == [("r0", 8), ("r1", 8), ("r2", 8)]
        after = {n: getattr(sql_service, n).stats() for n in ("parsed", "prepared")}
        for name in ("parsed", "prepared"):
            assert after[name]["hits"] > before[name]["hits"], name
            assert after[name]["misses"] == before[name]["misses"], name
        client.close()


def test_a_new_statement_is_parsed_once_on_its_first_run(tmp_path: Path, monkeypatch) -> None:
    """ADBC prepares a new text, then runs it: the handle's first typing and execution read the
    tree the prepare parsed (``trees``) rather than parse the text again."""
    import duckdb

    from flight_gateway.faces.flightsql import query, service

    parses: list[str] = []
    real = query.parse
    monkeypatch.setattr(service.query, "parse", lambda sql: parses.append(sql) or real(sql))
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}") as (server, _):
        client = client_for(server)
        duckdb.connect().execute(
            f"COPY (SELECT i::BIGINT AS id, 'r' || (i % 3) AS region FROM range(30) t(i)) "
            f"TO '{tmp_path / '0.parquet'}'"
        )
        client.create_table("t", COLUMNS)
        client.add_source("t", "f", "files", config={"root": str(tmp_path)},
                          state={"files": ["0.parquet"]})  # fmt: skip
        sql = "SELECT region, max(id) FROM t WHERE id < 20 GROUP BY region"
        assert _rows(client.uri, sql) == [("r0", 18), ("r1", 19), ("r2", 17)]
        assert parses == [sql]
        client.close()


def test_a_sources_files_in_place_are_listed_once_per_pinned_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each new relation of a version (other columns, another filter) is planned anew, but a
    source's files in place at its pinned state are asked of its kind once (DuckLake's answer
    costs ~0.2 s: its metadata attached and read)."""
    from planners.ducklake import DuckLakeKind
    from tests.gateway.helpers import DuckLakeFixture

    lake = DuckLakeFixture(tmp_path / "lake")
    snap = lake.execute(
        "CREATE TABLE lake.r (id BIGINT, region VARCHAR)",
        "INSERT INTO lake.r SELECT range, 'r' || (range % 3) FROM range(1000)",
    )
    asked: list[int] = []
    layout = DuckLakeKind.layout
    monkeypatch.setattr(
        DuckLakeKind, "layout", lambda self, req: asked.append(1) or layout(self, req)
    )
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}",
                         iceberg_rest_dir=str(tmp_path / "slices")) as (server, _):  # fmt: skip
        client = client_for(server)
        client.create_table("t", COLUMNS)
        client.add_source("t", "l", "ducklake", config=lake.source_config("r"),
                          state={"snapshot_id": snap})  # fmt: skip
        assert _rows(client.uri, "SELECT count(*) FROM t") == [(1000,)]
        assert _rows(client.uri, "SELECT max(id) FROM t WHERE region = 'r1'") == [(997,)]
        assert _rows(client.uri, "SELECT region, count(*) FROM t GROUP BY region") == [
            ("r0", 334), ("r1", 333), ("r2", 333)
        ]  # fmt: skip
        assert len(asked) == 1
        assert not list((tmp_path / "slices").rglob("*.parquet"))  # read in place
        client.close()


def test_column_sets_of_a_version_share_one_plan(
    gateway: tuple[Any, Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Statements reading other columns of a pinned version narrow its one plan (and its one
    set of slices) instead of planning the table again; the rows are the native read's."""
    from flight_gateway.faces.flightsql import relations

    _, client, _ = gateway
    planned: list[tuple[str, ...]] = []
    real = relations.plan_table

    def counted(reads: Any, snap: Any, columns: Any, *a: Any, **k: Any) -> Any:
        planned.append(tuple(columns))
        return real(reads, snap, columns, *a, **k)

    monkeypatch.setattr(relations, "plan_table", counted)
    native = client.read("t").to_pandas()
    assert _rows(client.uri, "SELECT count(id) FROM t") == [(500,)]
    assert _rows(client.uri, "SELECT region, count(*) FROM t GROUP BY region") == sorted(
        (r, len(g)) for r, g in native.groupby("region")
    )
    assert _rows(client.uri, "SELECT max(id), min(region) FROM t") == [
        (int(native["id"].max()), str(native["region"].min()))
    ]
    assert planned == [("id", "region")]


def test_filters_of_a_small_version_share_one_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each filter put on a small table version (a few files in place) reads the version's one
    plan: pruning so few files saves less than planning again (the statement still applies its
    filter: rows equal DuckDB's over the same file). A filter that prunes a source still plans
    the table for itself, and its statements read only the source left."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flight_gateway.faces.flightsql import relations

    filters: list[str | None] = []
    real = relations.plan_table

    def counted(reads: Any, snap: Any, columns: Any, flt: Any, *a: Any, **k: Any) -> Any:
        filters.append(flt)
        return real(reads, snap, columns, flt, *a, **k)

    monkeypatch.setattr(relations, "plan_table", counted)
    for region in ("r0", "r1"):
        ids = range(0, 500) if region == "r0" else range(500, 1000)
        pq.write_table(pa.table({"id": list(ids), "region": [region] * len(ids)}),
                       tmp_path / f"{region}.parquet")  # fmt: skip
    reach = {"paths": [str(tmp_path)]}
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", reach=reach) as (server, _):
        client = client_for(server)
        client.create_table("t", COLUMNS, partition_by=["region"])
        for region in ("r0", "r1"):
            client.add_source("t", region, "files", partition={"region": region},
                              config={"root": str(tmp_path)},
                              state={"files": [f"{region}.parquet"]})  # fmt: skip
        oracle = duckdb.connect()
        every = f"read_parquet('{tmp_path}/r*.parquet')"
        for sql in ("SELECT count(*) FROM t WHERE id < 100",
                    "SELECT count(*) FROM t WHERE id BETWEEN 250 AND 750",
                    "SELECT max(id) FROM t WHERE id % 7 = 3"):  # fmt: skip
            expected = oracle.execute(sql.replace("FROM t", f"FROM {every}")).fetchall()
            assert _rows(client.uri, sql) == expected
        assert filters == ["(id < 100)", None]  # the first filter, then the version's one plan
        filters.clear()
        assert _rows(client.uri, "SELECT count(*), min(id) FROM t WHERE region = 'r1'") == [
            (500, 500)
        ]
        assert filters == ["(region = 'r1')"]
        client.close()


def test_the_new_tables_of_a_statement_are_planned_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tables a statement reads that were not planned before at their versions are planned
    side by side (``PLAN_THREADS``): each plan below waits until the other one has started,
    which a plan after the other never sees. The rows are DuckDB's on the same files."""
    import threading

    from flight_gateway.faces.flightsql import relations

    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}") as (server, _):
        client = client_for(server)
        for t, n in (("a", 10), ("b", 7)):
            rows = f"SELECT i::BIGINT AS id, 'r' || (i % 2) AS region FROM range({n}) t(i)"
            _files_table(client, tmp_path, t, rows)
        both = threading.Barrier(2, timeout=10)
        real = relations.plan_table

        def side_by_side(*args: Any, **kwargs: Any) -> Any:
            both.wait()  # BrokenBarrierError after 10 s when planned one after the other
            return real(*args, **kwargs)

        monkeypatch.setattr(relations, "plan_table", side_by_side)
        sql = "SELECT a.region, count(*) FROM a JOIN b ON a.id = b.id GROUP BY a.region"
        got = _rows(client.uri, sql)
        expected = duckdb.sql(
            f"SELECT a.region, count(*) FROM '{tmp_path / 'a' / '0.parquet'}' a "
            f"JOIN '{tmp_path / 'b' / '0.parquet'}' b ON a.id = b.id GROUP BY a.region"
        ).fetchall()
        assert got == sorted(expected)
        client.close()
