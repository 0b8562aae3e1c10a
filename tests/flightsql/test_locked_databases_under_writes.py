"""Statements reuse their caller's locked database while writers commit new versions: each new
version's files lock a new database (with the files of the one it replaces), and every
statement still reads exactly one version. Readers over two tables, in turns, and a writer
appending consecutive ids to each: at any version a table holds ids 0..n-1, so
``sum(i) = n(n-1)/2``; a row twice or missing breaks it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pytest

from tests.gateway.helpers import client_for, running_gateway

pytestmark = pytest.mark.integration

TABLES = ("a", "b")
BATCH = 50


def _writer(client: Any, stop: threading.Event, errors: list[str]) -> None:
    start = dict.fromkeys(TABLES, 0)
    try:
        while not stop.is_set():
            for table in TABLES:
                ids = list(range(start[table], start[table] + BATCH))
                client.put(table, pa.table({"i": pa.array(ids, pa.int64())}), source="f")
                start[table] += BATCH
    except Exception as e:  # reported by the test
        errors.append(f"writer: {type(e).__name__}: {e}")


def _reader(uri: str, rounds: int, seen: list[int], errors: list[str]) -> None:
    try:
        with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            for n in range(rounds):
                table = TABLES[n % 2]
                cur.execute(f"SELECT count(*) AS n, coalesce(sum(i), 0) AS s FROM {table}")
                ((count, total),) = cur.fetchall()
                if total != count * (count - 1) // 2:
                    errors.append(f"{table}: {count} rows summing to {total}")
                seen.append(count)
    except Exception as e:
        errors.append(f"reader: {type(e).__name__}: {e}")


def test_readers_reusing_locked_databases_see_whole_versions_while_a_writer_commits(
    tmp_path: Path,
) -> None:
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}") as (server, _):
        client = client_for(server)
        for table in TABLES:
            root = tmp_path / table
            root.mkdir()
            client.create_table(table, [{"name": "i", "type": "int64"}])
            client.add_source(table, "f", "files", config={"root": str(root)})
        stop, errors, seen = threading.Event(), [], []
        writer = threading.Thread(target=_writer, args=(client, stop, errors))
        readers = [
            threading.Thread(target=_reader, args=(client.uri, 40, seen, errors)) for _ in range(3)
        ]
        writer.start()
        for r in readers:
            r.start()
        for r in readers:
            r.join()
        stop.set()
        writer.join()
        client.close()
    assert errors == []
    assert len(seen) == 120 and len(set(seen)) > 3  # reads saw many versions
