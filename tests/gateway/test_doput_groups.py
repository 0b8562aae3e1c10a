"""Uploads queued for the same sources share one write lease (DESIGN §18): each keeps its own
commit id and version, and a retry of any of them finds it. Into a kind that writes each upload
by itself (``files``) one failing does not fail the others; into Iceberg the group is one
transaction, which fails whole. Checked against pyiceberg reading the Iceberg table directly."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from clients import HarnessClient
from flight_gateway.core.metrics import REGISTRY
from flight_gateway.core.write import ingest
from tests.conftest import client_for
from tests.gateway.helpers import IcebergFixture

pytestmark = pytest.mark.integration
SCHEMA = [
    {"name": "id", "type": "int64", "nullable": False},
    {"name": "region", "type": "string"},
]
ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False), ("region", pa.string())])


@pytest.fixture
def table(client: HarnessClient, iceberg: IcebergFixture) -> IcebergFixture:
    iceberg.create("grouped", ARROW)
    client.create_table("t", SCHEMA, partition_by=["region"])
    client.commit(
        "t",
        add_sources=[
            {
                "name": "iceberg",
                "kind": "iceberg",
                "partition": {"region": "iceberg"},
                "config": iceberg.source_config("grouped"),
                "state": {"snapshot_id": None},
            },
        ],
    )
    return iceberg


def rows(region: str, first: int, n: int = 5) -> pa.Table:
    return pa.table({"id": range(first, first + n), "region": [region] * n}, schema=ARROW)


def groups_observed() -> float:
    return REGISTRY.get_sample_value("harness_doput_group_size_count") or 0.0


def queued(server: Any, source: str = "iceberg") -> int:
    """Uploads of this gateway queued for a source of ``t``, their leader included."""
    key = ingest._Upload(server.core.gw, "t", "", {source: pa.table({})}, 0, False).key
    return ingest._GROUPS.queued(key)


def put_all(server: Any, uploads: list[tuple[str, pa.Table]], source: str = "iceberg") -> list[Any]:
    """Each upload from its own client and thread, at once; their outcomes (or errors)."""
    out: list[Any] = [None] * len(uploads)

    def put(i: int, commit_id: str, data: pa.Table) -> None:
        with client_for(server) as c:
            try:
                out[i] = c.put("t", data, commit_id=commit_id, source=source)
            except Exception as e:
                out[i] = e

    threads = [
        threading.Thread(target=put, args=(i, cid, data)) for i, (cid, data) in enumerate(uploads)
    ]
    for t in threads:
        t.start()
    return [threads, out]


def wait_queued(server: Any, n: int, source: str = "iceberg") -> None:
    deadline = time.monotonic() + 30
    while queued(server, source) < n:
        assert time.monotonic() < deadline, f"{queued(server, source)} uploads queued, not {n}"
        time.sleep(0.02)


def grouped(
    server: Any,
    catalog: Any,
    lead: tuple[str, pa.Table],
    rest: list[tuple[str, pa.Table]],
    n: int,
    source: str = "iceberg",
) -> list[Any]:
    """``lead`` waits for the source's lock, held here, while ``rest`` queue behind it in the
    gateway (``n`` queued in all, the leader included); then the lock goes: every outcome (or
    error), ``lead``'s first."""
    held = catalog.lock("t", [source], owner="test", ttl_s=60)
    threads, out = put_all(server, [lead], source)
    time.sleep(0.3)  # the leader is waiting for the lock
    more, out_more = put_all(server, rest, source)
    wait_queued(server, n, source)
    catalog.unlock(held.lock_id)
    for t in threads + more:
        t.join(60)
    return out + out_more


def test_queued_uploads_commit_under_one_lease_each_with_its_own_version(
    gateway, client: HarnessClient, table: IcebergFixture
) -> None:
    server, catalog = gateway
    before = client.describe("t").version
    # The first upload leads and waits for the lock; the rest queue behind it in the gateway
    # (a principal has four uploads in progress at most), one of them a second try of an id
    # already queued (its reply "lost" before it was sent).
    uploads = [(f"up-{i}", rows("iceberg", 10 * i)) for i in range(3)] + [
        ("up-1", rows("iceberg", 10))
    ]
    groups = groups_observed()
    metadata = metadata_files(table)
    results = grouped(server, catalog, uploads[0], uploads[1:], 4)
    # One Iceberg transaction for the group's three snapshots: one metadata file.
    assert len(metadata_files(table) - metadata) == 1
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert groups_observed() - groups == 1  # the leader and the three queued while it waited
    applied = {
        cid: r["version"] for (cid, _), r in zip(uploads, results, strict=True) if r["applied"]
    }
    assert sorted(applied) == ["up-0", "up-1", "up-2"]
    assert sorted(applied.values()) == list(range(before + 1, before + 4))  # one version each
    again = [
        r
        for (cid, _), r in zip(uploads, results, strict=True)
        if cid == "up-1" and not r["applied"]
    ]
    assert len(again) == 1 and again[0]["version"] == applied["up-1"]
    for cid, version in applied.items():  # every id's version holds its rows and those before
        assert catalog.find_commit("t", cid) == version
        n = sum(1 for v in applied.values() if v <= version)
        assert client.read("t", version=version).num_rows == 5 * n
    direct = table.catalog.load_table("db.grouped").scan().to_arrow()  # pyiceberg, not the gateway
    ids = sorted(client.read("t").column("id").to_pylist())
    assert (
        ids
        == sorted(direct.column("id").to_pylist())
        == [*range(5), *range(10, 15), *range(20, 25)]
    )
    assert client.describe("t").source("iceberg").state["snapshot_id"] == (
        table.catalog.load_table("db.grouped").current_snapshot().snapshot_id
    )


def test_a_group_is_one_iceberg_transaction_and_a_failed_one_fails_every_upload(
    gateway, client: HarnessClient, table: IcebergFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An Iceberg group is one transaction of one snapshot per upload (``AppendsMany``): one
    metadata file for all. When the gateway fails after it landed and before the harness
    commit, every upload fails, and each retry (the middle one first: snapshots of the group
    lie before and after its own) applies once."""
    from planners.iceberg import IcebergKind

    server, catalog = gateway
    real_many = IcebergKind.append_many
    steps: list[list[str]] = []

    def crashing(self: IcebergKind, ctxs: Any, data: Any) -> Any:
        states = real_many(self, ctxs, data)
        steps.append([c.commit_id for c in ctxs])
        if len(steps) == 1:  # the Iceberg transaction landed; the harness commit never comes
            raise RuntimeError("simulated failure before the harness commit")
        return states

    monkeypatch.setattr(IcebergKind, "append_many", crashing)
    metadata = metadata_files(table)
    try:
        uploads = [(cid, rows("iceberg", n)) for cid, n in (("a", 10), ("bad", 20), ("b", 30))]
        results = grouped(server, catalog, ("lead", rows("iceberg", 0)), uploads, 4)
    finally:
        monkeypatch.undo()
    assert (
        len(steps) == 1 and steps[0][0] == "lead" and sorted(steps[0]) == ["a", "b", "bad", "lead"]
    )
    assert len(metadata_files(table) - metadata) == 1  # four snapshots, one metadata file
    assert len(table.catalog.load_table("db.grouped").snapshots()) == 4
    assert all("simulated failure" in str(r) for r in results), results
    assert client.read("t").num_rows == 0
    firsts = {"lead": 0, "a": 10, "bad": 20, "b": 30}
    middle = steps[0][2]  # the group's snapshots lie before and after its own
    for cid in [middle, *(c for c in steps[0] if c != middle)]:
        assert client.put("t", rows("iceberg", firsts[cid]), commit_id=cid, source="iceberg")[
            "applied"
        ]
    again = client.put("t", rows("iceberg", 20), commit_id="bad", source="iceberg")
    assert not again["applied"] and again["version"] == catalog.find_commit("t", "bad")
    ids = sorted(client.read("t").column("id").to_pylist())
    assert ids == sorted([*range(0, 5), *range(10, 15), *range(20, 25), *range(30, 35)])
    direct = (
        table.catalog.load_table("db.grouped")
        .scan(snapshot_id=client.describe("t").source("iceberg").state["snapshot_id"])
        .to_arrow()
    )
    assert sorted(direct.column("id").to_pylist()) == ids
    # Every data file on disk is one a snapshot names (what the retries' prepared files and
    # the dropped snapshots left was removed or is named).
    assert data_files(table) == committed_files(table)


def test_an_upload_failing_alone_in_a_group_of_files_fails_alone(
    gateway, client: HarnessClient, table: IcebergFixture, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Into a kind that writes each upload of a group by itself (``files``), one upload's
    failed write fails that upload only: the others commit, and its retry applies once."""
    from planners.files import FilesKind

    server, catalog = gateway
    (tmp_path / "files").mkdir()
    client.commit("t", add_sources=[{"name": "files", "kind": "files",
                                     "partition": {"region": "files"},
                                     "config": {"root": str(tmp_path / "files")},
                                     "state": {"files": []}}])  # fmt: skip
    real_append = FilesKind.append

    def flaky(self: FilesKind, ctx: Any, data: pa.Table) -> Any:
        if ctx.commit_id == "bad":
            raise RuntimeError("simulated write failure")
        return real_append(self, ctx, data)

    monkeypatch.setattr(FilesKind, "append", flaky)
    try:
        uploads = [(cid, rows("files", n)) for cid, n in (("a", 10), ("bad", 20), ("b", 30))]
        lead, *rest = grouped(server, catalog, ("lead", rows("files", 0)), uploads, 4, "files")
    finally:
        monkeypatch.undo()
    assert lead["applied"] and rest[0]["applied"] and rest[2]["applied"], (lead, rest)
    assert isinstance(rest[1], Exception) and "simulated write failure" in str(rest[1])
    assert sorted(client.read("t").column("id").to_pylist()) == [
        *range(0, 5), *range(10, 15), *range(30, 35)
    ]  # fmt: skip
    assert client.put("t", rows("files", 20), commit_id="bad", source="files")["applied"]
    assert client.read("t").num_rows == 20


def metadata_files(table: IcebergFixture) -> set[str]:
    location = table.catalog.load_table("db.grouped").location().removeprefix("file://")
    return {str(p) for p in Path(location, "metadata").glob("*.metadata.json")}


def test_a_group_commits_its_versions_in_one_transaction_and_fails_whole(
    gateway, client: HarnessClient, table: IcebergFixture
) -> None:
    """Each upload of a group appends from the states of the ones before it, so their versions
    commit together: one catalog call, and when it fails no upload applies (none of their rows
    shows) and each retry applies once."""
    server, catalog = gateway
    before = client.describe("t").version
    real = catalog.commit_all
    calls: list[list[str]] = []

    def crashing(name: str, commits: list[dict[str, Any]]) -> Any:
        calls.append([c["commit_id"] for c in commits])
        if len(calls) == 1:
            raise RuntimeError("simulated crash before the harness commit")
        return real(name, commits)

    catalog.commit_all = crashing
    try:
        uploads = [(f"g{i}", rows("iceberg", 10 * i)) for i in range(3)]
        results = grouped(server, catalog, uploads[0], uploads[1:], 3)
        assert len(calls) == 1 and sorted(calls[0]) == ["g0", "g1", "g2"]  # one group, one call
        assert all("simulated crash" in str(r) for r in results), results
        assert client.read("t").num_rows == 0 and client.describe("t").version == before
        # The retries, one by one, the last first: its Iceberg snapshot holds the rows of the
        # two before it too, which no commit published (their retries must not write them twice).
        for cid, data in reversed(uploads):
            assert client.put("t", data, commit_id=cid, source="iceberg")["applied"]
    finally:
        catalog.commit_all = real
    assert client.describe("t").version == before + 3
    assert sorted(client.read("t").column("id").to_pylist()) == [
        *range(0, 5), *range(10, 15), *range(20, 25)
    ]  # fmt: skip
    assert data_files(table) == committed_files(table)


def data_files(table: IcebergFixture) -> set[str]:
    location = table.catalog.load_table("db.grouped").location().removeprefix("file://")
    return {str(p) for p in Path(location, "data").rglob("*.parquet")}


def committed_files(table: IcebergFixture) -> set[str]:
    t = table.catalog.load_table("db.grouped")
    return {
        task.file.file_path.removeprefix("file://")
        for snap in t.snapshots()
        for task in t.scan(snapshot_id=snap.snapshot_id).plan_files()
    }


def test_iceberg_rows_are_written_before_the_lease_and_committed_under_it(
    gateway, client: HarnessClient, table: IcebergFixture
) -> None:
    """DESIGN §18: a writer holds the source's lock for its commit only. While another holds
    the lock, a DoPut's data file is already on disk and no snapshot names it; once the lock
    is free the DoPut commits that very file."""
    server, catalog = gateway
    held = catalog.lock("t", ["iceberg"], owner="test", ttl_s=60)
    threads, out = put_all(server, [("early", rows("iceberg", 0))])
    deadline = time.monotonic() + 30
    while not data_files(table):
        assert time.monotonic() < deadline, "no data file written while the lock was held"
        time.sleep(0.02)
    written = data_files(table)
    assert table.catalog.load_table("db.grouped").current_snapshot() is None
    assert out == [None]  # still waiting for the lock
    catalog.unlock(held.lock_id)
    for t in threads:
        t.join(60)
    assert out[0]["applied"], out
    assert committed_files(table) == written == data_files(table)
    assert sorted(client.read("t").column("id").to_pylist()) == list(range(5))


def test_a_doput_reads_the_head_with_its_commit_ids(
    client: HarnessClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether a DoPut's commit id was applied and the table's latest version are one catalog
    read before the lease and one under it (each a round trip to a Postgres catalog, ~15 ms
    under 64 readers and 16 writers on 2 cores), not two each."""
    from flight_gateway.catalog import queries

    (tmp_path / "files").mkdir()
    client.create_table("w", SCHEMA)
    client.commit("w", add_sources=[{"name": "f", "kind": "files",
                                     "config": {"root": str(tmp_path / "files")},
                                     "state": {"files": []}}])  # fmt: skip
    asked: list[str] = []
    real = queries.one_statement

    def counted(engine: Any, sql: str, params: Any) -> Any:
        asked.append(sql.split(" FROM ")[0])
        return real(engine, sql, params)

    monkeypatch.setattr(queries, "one_statement", counted)
    client.put("w", rows("x", 0), source="f", commit_id="c1")
    heads = [a for a in asked if "current_version" in a or "commit_id" in a]
    assert len(heads) == 2, asked
    assert client.read("w").num_rows == 5
    assert client.put("w", rows("x", 0), source="f", commit_id="c1") is not None  # a retry
    assert client.read("w").num_rows == 5
