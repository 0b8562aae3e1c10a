"""Maintenance is optimistic (DESIGN §18): a compaction holds no lock while it reads and writes,
so writers commit meanwhile and their rows survive its commit; a rewrite whose files were
replaced or deleted from since it read them gets CONFLICT and reads again, never the writer.
Files and Iceberg sources; writers and compactions also run together in threads."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import Conflict
from pipelines.compaction import compact, filesystem, rewrite_source
from tests.gateway.helpers import IcebergFixture

pytestmark = pytest.mark.integration
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
COLUMNS = [{"name": "id", "type": "int64", "nullable": False}, {"name": "v", "type": "string"}]


def rows(first: int, n: int) -> pa.Table:
    return pa.table({"id": range(first, first + n), "v": [f"r{i}" for i in range(n)]}, SCHEMA)


def ids(client: HarnessClient, **kw: Any) -> list[int]:
    return sorted(client.read("t", **kw).column("id").to_pylist())


@pytest.fixture(params=["files", "iceberg"])
def source(request: pytest.FixtureRequest, client: HarnessClient, tmp_path: Path) -> str:
    """Table ``t`` with one source ``s`` of the kind, holding ids 0..99 in four writes."""
    if request.param == "files":
        config: dict[str, Any] = {"root": str(tmp_path / "files")}
        state: dict[str, Any] = {"files": []}
    else:
        iceberg = IcebergFixture(tmp_path)
        iceberg.catalog.create_table("db.s", schema=SCHEMA)
        config, state = iceberg.source_config("s"), {"snapshot_id": None}
    client.create_table("t", COLUMNS)
    client.add_source("t", "s", request.param, config=config, state=state)
    for first in range(0, 100, 25):
        client.put("t", rows(first, 25))
    return str(request.param)


def one_file_writer(client: HarnessClient, during: Callable[[], None]) -> Any:
    """A rewrite's ``write``: reads the pinned rows, runs ``during`` (what happens while a
    long rewrite is under way), then writes them as one file."""

    def write(pinned: int, location: str) -> tuple[list[str], int]:
        data = client.read("t", version=pinned, sources=["s"]).cast(SCHEMA)
        during()
        path = f"{location}/{uuid.uuid4().hex}.parquet"
        fs, local = filesystem(path)
        with fs.open_output_stream(local) as out:
            pq.write_table(data, out)
        return [path], data.num_rows

    return write


def test_a_writer_commits_during_a_rewrite_and_its_rows_stay(
    client: HarnessClient, source: str
) -> None:
    """Before §18 the writer waited for the rewrite's lock (its DoPut waits up to 60 s)."""
    done = threading.Event()

    def writer() -> None:
        client.put("t", rows(1000, 10))
        done.set()

    def during() -> None:
        t = threading.Thread(target=writer)
        t.start()
        t.join(15)
        assert done.is_set(), "the writer waited for the rewrite"

    result = rewrite_source(client, "t", "s", one_file_writer(client, during))
    assert result.rows == 100
    assert ids(client) == list(range(100)) + list(range(1000, 1010))
    assert client.history("t", limit=1)[0].summary.get("operation") == "compaction"


def test_a_rewrite_of_replaced_files_conflicts_and_reads_again(
    client: HarnessClient, source: str
) -> None:
    """Another compaction commits while this one writes: this one's commit is CONFLICT (not
    a second copy of the rows), nothing of it is committed, and the retry reads again."""
    attempts = []

    def during() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            compact(client, "t", "s")

    with pytest.raises(Conflict):
        rewrite_source(client, "t", "s", one_file_writer(client, during), attempts=1)
    before = client.describe("t").version
    assert ids(client) == list(range(100))
    result = rewrite_source(client, "t", "s", one_file_writer(client, during))
    assert len(attempts) == 2 and result.rows == 100
    assert ids(client) == list(range(100)) and client.describe("t").version == before + 1


def test_commit_write_validates_read_version(client: HarnessClient, source: str) -> None:
    begun = client.begin_write("t", "s")
    with pytest.raises(Exception, match="read_version"):
        client.action("harness.commit_write", {"table": "t", "write_id": begun["write_id"],
                      "paths": [], "read_version": 1})  # fmt: skip
    client.abort_write("t", begun["write_id"], "s")


def test_deletes_since_the_read_win_over_the_rewrite(client: HarnessClient, tmp_path: Path) -> None:
    """Rows deleted from an Iceberg source while a rewrite wrote them: the rewrite conflicts
    and reads again, so the deleted rows stay deleted."""
    iceberg = IcebergFixture(tmp_path)
    iceberg.catalog.create_table("db.k", schema=SCHEMA, properties={"format-version": "2"})
    client.create_table("t", COLUMNS, primary_key=["id"])
    client.add_source("t", "s", "iceberg", config=iceberg.source_config("k"),
                      state={"snapshot_id": None})  # fmt: skip
    client.put("t", rows(0, 50))
    calls = []

    def during() -> None:
        calls.append(1)
        if len(calls) == 1:
            gone = pa.table({"id": pa.array([3, 4], pa.int64()), "v": ["x", "x"],
                             "_op": ["delete", "delete"]})  # fmt: skip
            client.put("t", gone, merge=True)

    rewrite_source(client, "t", "s", one_file_writer(client, during))
    assert len(calls) == 2
    assert ids(client) == [i for i in range(50) if i not in (3, 4)]


def test_writers_and_compactions_together_lose_and_double_nothing(
    client: HarnessClient, source: str
) -> None:
    """Four writers and a compaction loop at once: every row written is read exactly once."""
    stop, errors, written = threading.Event(), [], []
    lock = threading.Lock()

    def writer(w: int) -> None:
        try:
            with HarnessClient(client.uri) as c:
                for i in range(12):
                    first = 10_000 * (w + 1) + 10 * i
                    c.put("t", rows(first, 10))
                    with lock:
                        written.extend(range(first, first + 10))
        except Exception as e:
            errors.append(e)

    def compactor() -> None:
        with HarnessClient(client.uri) as c:
            while not stop.is_set():
                try:
                    compact(c, "t", "s")
                except Exception as e:
                    errors.append(e)
                    return

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    comp = threading.Thread(target=compactor)
    comp.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    stop.set()
    comp.join(300)
    assert not errors, errors
    compact(client, "t", "s")
    assert ids(client) == sorted(list(range(100)) + written)
    ops = [c.summary.get("operation") for c in client.history("t")]
    assert ops.count("compaction") >= 2


def test_movers_read_before_their_lease_and_never_double(
    client: HarnessClient, tmp_path: Path, kafka_bootstrap: str
) -> None:
    """Two movers Kafka -> Iceberg read the rows to move before taking their lease while a
    writer produces into Kafka: when the other mover moved first, the rows are read again
    under the lease; every row is read exactly once at every version."""
    from pipelines.mover import Mover

    iceberg = _kafka_and_iceberg(client, tmp_path, kafka_bootstrap)
    first = client.describe("t").version
    stop, errors = threading.Event(), []

    def writer() -> None:
        try:
            with HarnessClient(client.uri) as c:
                for i in range(20):
                    c.put("t", rows(10 * i, 10), source="k")
        except Exception as e:
            errors.append(e)

    def mover() -> None:
        try:
            with HarnessClient(client.uri) as c:
                while not stop.is_set():
                    Mover(c, "t", "k", "cold", wait_s=60).run_once()
        except Exception as e:
            errors.append(e)

    movers = [threading.Thread(target=mover) for _ in range(2)]
    for t in movers:
        t.start()
    writer()
    stop.set()
    for t in movers:
        t.join(300)
    assert not errors, errors
    Mover(client, "t", "k", "cold").run_once()
    assert ids(client) == list(range(200))
    assert client.describe("t").source("k").state["low"] == 200
    for v in range(first, client.describe("t").version + 1):
        seen = ids(client, version=v)
        assert seen == sorted(set(seen)), v
    moves = [c for c in client.history("t") if c.summary.get("operation") == "move"]
    assert len(moves) >= 2
    # A mover that lost the race wrote its data files before its lease for nothing: removed.
    assert _unreferenced(iceberg, "db.cold") == set()


def _kafka_and_iceberg(client: HarnessClient, tmp_path: Path, bootstrap: str) -> IcebergFixture:
    """Table ``t`` with a Kafka source ``k`` and an empty Iceberg source ``cold``."""
    from tests.gateway.kafka_helpers import new_topic

    iceberg = IcebergFixture(tmp_path)
    iceberg.catalog.create_table("db.cold", schema=SCHEMA)
    kafka = {"bootstrap_servers": bootstrap, "topic": new_topic(bootstrap), "partition": 0}
    client.create_table("t", COLUMNS)
    client.commit("t", add_sources=[
        {"name": "k", "kind": "kafka", "config": kafka, "state": {"low": 0, "high": 0}},
        {"name": "cold", "kind": "iceberg", "config": iceberg.source_config("cold"),
         "state": {"snapshot_id": None}},
    ])  # fmt: skip
    return iceberg


def _unreferenced(iceberg: IcebergFixture, identifier: str) -> set[str]:
    """Data files under the table's location that none of its snapshots lists."""
    table = iceberg.catalog.load_table(identifier)
    listed = {
        p.removeprefix("file://") for p in table.inspect.all_data_files()["file_path"].to_pylist()
    }
    on_disk = {str(f) for f in Path(table.location().removeprefix("file://")).rglob("*.parquet")}
    return on_disk - listed


def test_a_mover_writes_its_cold_files_before_its_lease(
    client: HarnessClient, tmp_path: Path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DESIGN §18: a move Kafka -> Iceberg writes the moved rows' data files before taking the
    lease on both sources, so writers of either source commit while it writes (held here until
    they did); under the lease only the commits are left. Every row is read once at every
    version."""
    import pyiceberg.io.pyarrow as pyiceberg_arrow

    from pipelines.mover import Mover

    _kafka_and_iceberg(client, tmp_path, kafka_bootstrap)
    client.put("t", rows(0, 50), source="k")
    first = client.describe("t").version

    writing, release = threading.Event(), threading.Event()
    original = pyiceberg_arrow._dataframe_to_data_files

    def held_while_moving(*args: Any, **kwargs: Any) -> Any:
        df = kwargs.get("df", args[2] if len(args) > 2 else None)
        if df is not None and df.num_rows and min(df.column("id").to_pylist()) < 1_000:
            writing.set()  # the moved rows (ids below 1,000): hold them until writers committed
            release.wait(60)
        return original(*args, **kwargs)

    monkeypatch.setattr(pyiceberg_arrow, "_dataframe_to_data_files", held_while_moving)
    errors: list[BaseException] = []

    def move() -> None:
        try:
            with HarnessClient(client.uri) as c:
                Mover(c, "t", "k", "cold", wait_s=60).run_once()
        except BaseException as e:
            errors.append(e)

    mover = threading.Thread(target=move)
    mover.start()
    try:
        assert writing.wait(60), "the move never wrote the cold source's files"
        done: list[str] = []

        def write(source: str, first_id: int) -> None:
            try:
                with HarnessClient(client.uri) as c:
                    c.put("t", rows(first_id, 10), source=source)
                done.append(source)
            except BaseException as e:
                errors.append(e)

        writers = [threading.Thread(target=write, args=("cold", 10_000)),
                   threading.Thread(target=write, args=("k", 500))]  # fmt: skip
        for t in writers:
            t.start()
        for t in writers:
            t.join(20)
        assert sorted(done) == ["cold", "k"], "writers waited for the move's data files"
    finally:
        release.set()
        mover.join(120)
    assert not errors, errors
    Mover(client, "t", "k", "cold").run_once()
    assert ids(client) == [*range(50), *range(500, 510), *range(10_000, 10_010)]
    assert client.describe("t").source("k").state["low"] == 60
    for v in range(first, client.describe("t").version + 1):
        seen = ids(client, version=v)
        assert seen == sorted(set(seen)), v
