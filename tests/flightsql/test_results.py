"""A deterministic statement's result is kept for the statements that pin the same versions
(``plans``: ``results``; DESIGN §17, a pinned version never changes): the same text again runs no
worker, a new version is computed again, and what may not be reused never is: statements that
call ``now()``/``random()`` or sample, results that failed, were left early or are too large,
tickets whose table was dropped, callers who may not read the table."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest

from clients import HarnessClient
from flight_gateway.faces.flightsql import plans, query
from flight_gateway.protocol.flightsql import pack, pb
from tests.gateway.helpers import client_for, running_gateway

pytestmark = pytest.mark.integration


def _table(client: HarnessClient, root: Path, rows: int = 100) -> None:
    root.mkdir(parents=True, exist_ok=True)
    data = pa.table({"id": pa.array(range(rows), pa.int64()), "s": [f"v{i}" for i in range(rows)]})
    pq.write_table(data, root / "a.parquet")
    client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "s", "type": "string"}])
    client.add_source("t", "f", "files", config={"root": str(root)}, state={"files": ["a.parquet"]})


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Any, HarnessClient]]:
    limits = getattr(request, "param", {})
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", limits=limits) as (server, _):
        client = client_for(server)
        _table(client, tmp_path / "t")
        yield server, client
        client.close()


class _Runs:
    """Counts the statements a worker ran (typing one is not counted)."""

    def __init__(self, server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        run = server.sql._run

        def counted(plan: Any, op: str, *more: Any) -> Any:
            self.count += op == "run"
            return run(plan, op, *more)

        monkeypatch.setattr(server.sql, "_run", counted)


def _rows(uri: str, sql: str) -> list[tuple]:
    with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return list(cur.fetchall())


def test_the_same_statement_at_the_same_versions_is_answered_from_its_kept_result(
    served: tuple[Any, HarnessClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, client = served
    runs = _Runs(server, monkeypatch)
    sql = "SELECT count(*), sum(id) FROM t"
    first = client.describe("t").version
    assert _rows(client.uri, sql) == [(100, 4950)]
    assert _rows(client.uri, sql) == [(100, 4950)]
    assert runs.count == 1
    assert server.sql.results.stats()["hits"] == 1
    client.put("t", pa.table({"id": [100], "s": ["v100"]}))  # a new version
    assert _rows(client.uri, sql) == [(101, 5050)]
    assert runs.count == 2
    pinned = f"SELECT count(*), sum(id) FROM t FOR VERSION AS OF {first}"
    assert _rows(client.uri, pinned) == [(100, 4950)]
    assert _rows(client.uri, pinned) == [(100, 4950)]
    assert runs.count == 3


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT random() < 2 AS r, count(*) FROM t",
        "SELECT now() IS NOT NULL AS n, count(*) FROM t",
        "SELECT current_date IS NOT NULL AS d, count(*) FROM t",
        "SELECT count(*) > 0 AS c FROM t USING SAMPLE 50 PERCENT (bernoulli)",
    ],
)
def test_statements_that_may_answer_otherwise_are_run_each_time(
    served: tuple[Any, HarnessClient], monkeypatch: pytest.MonkeyPatch, sql: str
) -> None:
    server, client = served
    runs = _Runs(server, monkeypatch)
    first = _rows(client.uri, sql)
    assert _rows(client.uri, sql) == first
    assert runs.count == 2
    assert server.sql.results.stats()["entries"] == 0


@pytest.mark.parametrize(
    ("sql", "same"),
    [
        ("SELECT s, count(*) FROM __harness_0 WHERE s LIKE 'v%' GROUP BY s", True),
        ("SELECT CAST(id AS DOUBLE) / 3, coalesce(s, 'x') FROM __harness_0", True),
        ("SELECT random() FROM __harness_0", False),
        ("SELECT gen_random_uuid() FROM __harness_0", False),
        ("SELECT get_current_timestamp() FROM __harness_0", False),
        ("SELECT current_timestamp FROM __harness_0", False),
        ("SELECT * FROM __harness_0 USING SAMPLE 10", False),
        ("SELECT * FROM __harness_0 TABLESAMPLE 10%", False),
    ],
)
def test_what_is_deterministic_is_duckdbs_own_word(sql: str, same: bool) -> None:
    assert query.check_duckdb_functions(sql) is same


def test_a_failed_statement_is_not_kept(
    served: tuple[Any, HarnessClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, client = served
    runs = _Runs(server, monkeypatch)
    for _ in range(2):
        with pytest.raises(Exception, match=r"(?i)conversion|could not convert"):
            _rows(client.uri, "SELECT CAST(s AS INTEGER) FROM t")
    assert runs.count == 2
    assert server.sql.results.stats()["entries"] == 0


def test_a_result_left_early_is_not_kept_and_a_whole_one_is(
    served: tuple[Any, HarnessClient],
) -> None:
    server, client = served
    # 500,000 rows of 8 bytes in several batches: small enough to keep (an eighth of 64 MB)
    sql = "SELECT a.id FROM t a, t b, t c WHERE c.id < 50"
    raw = fl.connect(client.uri)
    descriptor = fl.FlightDescriptor.for_command(pack(pb.CommandStatementQuery(query=sql)))
    info = raw.get_flight_info(descriptor)
    reader = raw.do_get(info.endpoints[0].ticket)
    first = reader.read_chunk()
    assert first.data is not None and first.data.num_rows < 500_000
    reader.cancel()
    time.sleep(0.5)
    assert server.sql.results.stats()["entries"] == 0
    whole = raw.do_get(raw.get_flight_info(descriptor).endpoints[0].ticket).read_all()
    assert whole.num_rows == 500_000
    assert server.sql.results.stats()["entries"] == 1
    raw.close()


@pytest.mark.parametrize("served", [{"sql_result_cache_mb": 1}], indirect=True)
def test_a_result_larger_than_an_eighth_of_the_cache_is_not_kept(
    served: tuple[Any, HarnessClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, client = served
    runs = _Runs(server, monkeypatch)
    sql = "SELECT a.id, b.id AS j FROM t a, t b"  # 10,000 rows of 16 bytes: over 128 KiB
    assert len(_rows(client.uri, sql)) == 10_000
    assert len(_rows(client.uri, sql)) == 10_000
    assert runs.count == 2
    assert server.sql.results.stats()["entries"] == 0
    assert _rows(client.uri, "SELECT count(*) FROM t") == [(100,)]
    assert server.sql.results.stats()["entries"] == 1


def test_a_ticket_whose_table_was_dropped_is_refused_though_its_result_is_kept(
    served: tuple[Any, HarnessClient], tmp_path: Path
) -> None:
    server, client = served
    sql = "SELECT count(*) FROM t"
    assert _rows(client.uri, sql) == [(100,)]
    assert server.sql.results.stats()["entries"] == 1  # kept
    raw = fl.connect(client.uri)
    descriptor = fl.FlightDescriptor.for_command(pack(pb.CommandStatementQuery(query=sql)))
    ticket = raw.get_flight_info(descriptor).endpoints[0].ticket  # pins the kept version
    client.drop_table("t")
    with pytest.raises(KeyError, match="does not exist"):  # NOT_FOUND
        raw.do_get(ticket).read_all()
    _table(client, tmp_path / "t2", rows=7)  # the same name again: another table id
    assert _rows(client.uri, sql) == [(7,)]
    raw.close()


def test_a_statement_asks_the_catalog_for_its_tables_heads_once_per_call(
    served: tuple[Any, HarnessClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table named three times, and the other tables of a statement, are pinned with one
    catalog read of their heads per call (GetFlightInfo, then DoGet), not one per name,
    whether the statement started at GetFlightInfo or at DoGet."""
    server, client = served
    sql = "SELECT count(*) FROM t a JOIN t b USING (id) JOIN t c USING (id) WHERE a.id < 10"
    assert _rows(client.uri, sql) == [(10,)]  # typed (and kept) before
    catalog = server.sql.reads.catalog
    calls: list[list[str]] = []
    heads = catalog.heads

    def counted(names: Any, as_of: Any = None) -> Any:
        calls.append(list(names))
        return heads(names, as_of)

    monkeypatch.setattr(catalog, "heads", counted)
    monkeypatch.setattr(catalog, "head", lambda *a, **k: pytest.fail("one head per name"))
    raw = fl.connect(client.uri)
    descriptor = fl.FlightDescriptor.for_command(pack(pb.CommandStatementQuery(query=sql)))
    info = raw.get_flight_info(descriptor)
    assert len(calls) == 1
    assert raw.do_get(info.endpoints[0].ticket).read_all().column(0).to_pylist() == [10]
    assert calls == [["t", "t", "t"], ["t", "t", "t"]]
    server.sql.results = plans.Results(0)  # computed this time: started at GetFlightInfo
    info = raw.get_flight_info(descriptor)
    assert raw.do_get(info.endpoints[0].ticket).read_all().column(0).to_pylist() == [10]
    assert len(calls) == 4
    server.sql.early.wait_s = 0  # started at DoGet
    info = raw.get_flight_info(descriptor)
    assert raw.do_get(info.endpoints[0].ticket).read_all().column(0).to_pylist() == [10]
    assert len(calls) == 6
    raw.close()
