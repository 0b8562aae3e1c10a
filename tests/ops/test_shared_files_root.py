"""Two harness catalogs (two deployments) writing into one files root: each names its files with
its catalog's tag, so neither takes the other's file for its own nor deletes it in maintenance.
Before the tag, the same table, source and commit id in both wrote one file name (the second
catalog took the first's file for a retry of its own and read the first's rows), and either
catalog's maintenance deleted every file of the other's."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from clients import HarnessClient
from flight_gateway.catalog import Catalog
from flight_gateway.catalog.db import SCHEMA_VERSION, catalog_info, normalize_url
from flight_gateway.core.maintenance import run_once
from flight_gateway.protocol.errors import InvalidArgument
from tests.gateway.helpers import client_for, running_gateway

pytestmark = pytest.mark.integration


@pytest.fixture
def two(tmp_path: Path) -> Iterator[list[tuple[HarnessClient, Catalog]]]:
    with (
        running_gateway(f"sqlite:///{tmp_path / 'a.db'}") as (server_a, cat_a),
        running_gateway(f"sqlite:///{tmp_path / 'b.db'}") as (server_b, cat_b),
    ):
        clients = [client_for(server_a), client_for(server_b)]
        yield [(clients[0], cat_a), (clients[1], cat_b)]
        for c in clients:
            c.close()


def _table(client: HarnessClient, root: Path) -> None:
    client.create_table("t", [{"name": "id", "type": "int64"}])
    state = {"files": []}
    client.add_source("t", "f", "files", config={"root": str(root)}, state=state)


def _ids(client: HarnessClient) -> list[int]:
    return sorted(client.read("t").column("id").to_pylist())


def _on_disk(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_two_catalogs_share_a_root(two, tmp_path: Path) -> None:
    (a, cat_a), (b, cat_b) = two
    assert cat_a.catalog_tag != cat_b.catalog_tag
    root = tmp_path / "shared"
    root.mkdir()
    for client in (a, b):
        _table(client, root)
    # The same table, source and commit id in both catalogs.
    a.put("t", pa.table({"id": pa.array([1, 2], pa.int64())}), commit_id="load-1")
    b.put("t", pa.table({"id": pa.array([10, 20, 30], pa.int64())}), commit_id="load-1")
    assert _ids(a) == [1, 2]
    assert _ids(b) == [10, 20, 30]
    names = a.describe("t").sources[0].state["files"] + b.describe("t").sources[0].state["files"]
    assert len(set(names)) == 2
    assert names[0].startswith(f"harness-{cat_a.catalog_tag}-")
    assert names[1].startswith(f"harness-{cat_b.catalog_tag}-")

    # A Spark write staged by each and not committed yet, and a file of each no version lists
    # (a commit that failed after writing it).
    staged = {}
    for client, cat in two:
        begun = client.begin_write("t")
        location = Path(begun["location"])
        assert location.name.startswith(f"spark-{cat.catalog_tag}-")
        pq.write_table(pa.table({"id": pa.array([99], pa.int64())}), location / "part-0.parquet")
        staged[cat.catalog_tag] = begun
        unused = root / f"harness-{cat.catalog_tag}-{'a' * 32}.parquet"
        pq.write_table(pa.table({"id": pa.array([5], pa.int64())}), unused)
    before = _on_disk(root)

    deleted = run_once(cat_a, grace_s=0).to_json()["deleted_files"]
    gone = {str(Path(p).relative_to(root)) for p in deleted}
    location_a = Path(staged[cat_a.catalog_tag]["location"]).name
    assert gone == {
        f"harness-{cat_a.catalog_tag}-{'a' * 32}.parquet",
        f"{location_a}/part-0.parquet",
    }
    assert _on_disk(root) == before - gone
    assert _ids(b) == [10, 20, 30]
    # B's staged write is still there to commit.
    begun = staged[cat_b.catalog_tag]
    b.commit_write("t", begun["write_id"], [begun["location"] + "/part-0.parquet"])
    assert _ids(b) == [10, 20, 30, 99]
    deleted = run_once(cat_b, grace_s=0).to_json()["deleted_files"]
    assert [Path(p).name for p in deleted] == [f"harness-{cat_b.catalog_tag}-{'a' * 32}.parquet"]
    assert _ids(a) == [1, 2]


def test_files_without_a_tag_are_deleted_only_when_the_operator_says_the_root_is_ours(
    two, tmp_path: Path
) -> None:
    """Untagged files (a release before the tag wrote them) may be any catalog's, also where no
    other tag is seen yet (another catalog that wrote nothing since): kept unless ``maintain
    --clean-untagged``, and kept even then where another catalog's tag is seen."""
    (a, cat_a), (b, _cat_b) = two
    alone, shared, legacy = tmp_path / "alone", tmp_path / "shared", tmp_path / "legacy"
    old_file, old_dir = f"harness-{'0' * 32}.parquet", f"spark-{'1' * 32}"
    for root in (alone, shared, legacy):
        root.mkdir()
        pq.write_table(pa.table({"id": [0]}), root / old_file)
        (root / old_dir).mkdir()
        pq.write_table(pa.table({"id": [0]}), root / old_dir / "part-0.parquet")
    _table(a, alone)
    for name, root in (("g", shared), ("h", legacy)):
        a.add_source("t", name, "files", config={"root": str(root)}, state={"files": []})
    # B writes into the shared root, and committed the legacy root's old file before the tag.
    _table(b, shared)
    b.put("t", pa.table({"id": pa.array([7], pa.int64())}))
    b.add_source("t", "old", "files", config={"root": str(legacy)}, state={"files": [old_file]})

    assert run_once(cat_a, grace_s=0).to_json()["deleted_files"] == []
    assert _ids(b) == [0, 7]  # B's file of the old release, in a root A also writes into

    deleted = run_once(cat_a, grace_s=0, clean_untagged=True).to_json()["deleted_files"]
    # Where another catalog's tag is seen, nothing untagged goes. Elsewhere the flag is the
    # operator's word that the root is A's alone; said wrongly ("legacy" holds B's file of the
    # old release, and nothing in the root tells), the file goes: why it is not the default.
    assert sorted(os.path.relpath(p, tmp_path) for p in deleted) == [
        f"alone/{old_file}",
        f"alone/{old_dir}/part-0.parquet",
        f"legacy/{old_file}",
        f"legacy/{old_dir}/part-0.parquet",
    ]
    assert old_file in _on_disk(shared)


def test_a_catalog_made_before_its_identity_gets_one_once(catalog_url: str) -> None:
    Catalog(catalog_url).close()
    engine = sa.create_engine(normalize_url(catalog_url))
    with engine.begin() as conn:  # as schema version 4 left it: no identity
        conn.execute(sa.text(f"ALTER TABLE {catalog_info.name} DROP COLUMN catalog_id"))
        conn.execute(sa.text(f"UPDATE {catalog_info.name} SET schema_version = 4"))
    engine.dispose()
    first = Catalog(catalog_url)
    second = Catalog(catalog_url)
    try:
        assert re.fullmatch("[0-9a-f]{32}", first.catalog_id)
        assert second.catalog_id == first.catalog_id
    finally:
        first.close()
        second.close()
    engine = sa.create_engine(normalize_url(catalog_url))
    with engine.connect() as conn:
        version = conn.execute(sa.select(catalog_info.c.schema_version)).scalar_one()
    engine.dispose()
    assert version == SCHEMA_VERSION


def test_a_write_staged_before_the_tag_still_commits(two, tmp_path: Path) -> None:
    """A Spark write begun on a release before staging names carried the catalog's tag (its
    files in ``spark-<write_id>/``) commits through this one."""
    (a, cat_a), _ = two
    root = tmp_path / "data"
    root.mkdir()
    _table(a, root)
    begun = a.begin_write("t")
    assert Path(begun["location"]).name == f"spark-{cat_a.catalog_tag}-{begun['write_id']}"
    old = root / f"spark-{begun['write_id']}"
    old.mkdir()
    pq.write_table(pa.table({"id": pa.array([3], pa.int64())}), old / "part-0.parquet")
    a.commit_write("t", begun["write_id"], [str(old / "part-0.parquet")])
    assert _ids(a) == [3]
    with pytest.raises(InvalidArgument, match="location"):
        other = a.begin_write("t")
        a.commit_write("t", other["write_id"], [str(root / "elsewhere.parquet")])
