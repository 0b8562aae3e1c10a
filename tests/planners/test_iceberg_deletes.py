"""Merge-on-read writes (planners.iceberg_deletes): data files plus equality/position delete files
in one snapshot, read back by an independent reader, DuckDB's iceberg extension, and compared
with a Python oracle (last write per key wins, deleted keys absent)."""

from __future__ import annotations

import glob
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.manifest import DataFileContent, ManifestContent
from pyiceberg.types import StringType

from planners.iceberg_deletes import write_changes, write_position_deletes
from tests.gateway.helpers import IcebergFixture
from tests.services import missing

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("qty", pa.int32()),
    ]
)
ID = 1  # field id of "id" in a table created from SCHEMA

Row = dict[str, Any]


# --- fixtures and helpers --------------------------------------------------------------------


@pytest.fixture
def iceberg(tmp_path: Path) -> IcebergFixture:
    return IcebergFixture(tmp_path)


@pytest.fixture(scope="module")
def duck() -> Iterator[Any]:
    """DuckDB with the iceberg extension loaded from its wheel (offline, no autoload)."""
    import duckdb
    import duckdb_extensions

    con = duckdb.connect(
        config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    )
    try:
        for name in ("avro", "iceberg"):
            duckdb_extensions.import_extension(name, con=con)  # INSTALL only ...
            con.load_extension(name)  # ... so LOAD explicitly
    except Exception as e:
        con.close()
        missing(f"DuckDB iceberg extension (duckdb-extension-iceberg/-avro==1.5.5): {e}")
    yield con
    con.close()


def v2_table(iceberg: IcebergFixture, name: str, schema: pa.Schema = SCHEMA, **kw: Any) -> Any:
    return iceberg.catalog.create_table(
        f"db.{name}", schema=schema, properties={"format-version": "2"}, **kw
    )


def rows(*items: tuple[int, str | None, int | None]) -> pa.Table:
    return pa.table(
        {
            "id": [i for i, _, _ in items],
            "name": [n for _, n, _ in items],
            "qty": [q for _, _, q in items],
        },
        schema=SCHEMA,
    )


def keys(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})


def upsert(table: Any, data: pa.Table, delete_ids: Sequence[int] = ()) -> int:
    """Upsert ``data`` by id and delete ``delete_ids``: one equality delete of both key sets."""
    ids = data.column("id").to_pylist() + list(delete_ids)
    return write_changes(table, data=data, deletes=keys(*ids), equality_ids=[ID])


class Oracle:
    """The expected table: last write per key wins, deleted keys absent."""

    def __init__(self) -> None:
        self.rows: dict[int, Row] = {}

    def apply(self, data: pa.Table | None, delete_ids: Sequence[int] = ()) -> None:
        for key in delete_ids:
            self.rows.pop(key, None)
        for row in data.to_pylist() if data is not None else []:
            self.rows[row["id"]] = row

    def expected(self, columns: Sequence[str]) -> list[Row]:
        return [{c: r.get(c) for c in columns} for _, r in sorted(self.rows.items())]


def duck_rows(duck: Any, table: Any, snapshot_id: int | None = None) -> list[Row]:
    """The table as DuckDB's iceberg extension reads it (from the metadata file)."""
    opts = f", snapshot_from_id => {snapshot_id}" if snapshot_id is not None else ""
    rel = duck.execute(
        f"SELECT * FROM iceberg_scan('{table.metadata_location}'{opts}) ORDER BY id"
    ).to_arrow_table()
    return rel.to_pylist()  # type: ignore[no-any-return]


def manifests(table: Any) -> list[Any]:
    return list(table.current_snapshot().manifests(table.io))


def data_dir_files(table: Any) -> set[str]:
    return set(glob.glob(table.location().removeprefix("file://") + "/data/*"))


# --- equality deletes ------------------------------------------------------------------------


def test_upserts_and_deletes_across_three_sequence_numbers(
    iceberg: IcebergFixture, duck: Any
) -> None:
    table = v2_table(iceberg, "upserts")
    oracle = Oracle()

    first = rows(*[(i, f"v1-{i}", i) for i in range(1, 7)])
    table.append(first)  # sequence number 1
    oracle.apply(first)
    s1 = table.current_snapshot().snapshot_id

    # seq 2: key 2 updated, key 7 inserted (its own delete must not hide it), keys 3 and 4 deleted
    second = rows((2, "v2-2", 20), (7, "v2-7", 70))
    s2 = upsert(table, second, delete_ids=[3, 4])
    oracle.apply(second, [3, 4])
    after_s2 = oracle.expected(SCHEMA.names)

    # seq 3: key 2 updated again, deleted key 4 comes back, key 5 updated, key 1 deleted
    third = rows((2, "v3-2", 200), (4, "v3-4", None), (5, "v3-5", 500))
    s3 = upsert(table, third, delete_ids=[1])
    oracle.apply(third, [1])

    assert duck_rows(duck, table) == oracle.expected(SCHEMA.names)
    assert [r["id"] for r in oracle.expected(["id"])] == [2, 4, 5, 6, 7]
    # each snapshot reads as of its own sequence number
    assert duck_rows(duck, table, s2) == after_s2
    assert duck_rows(duck, table, s1) == first.to_pylist()

    snapshots = {s.snapshot_id: s for s in table.metadata.snapshots}
    assert [snapshots[s].sequence_number for s in (s1, s2, s3)] == [1, 2, 3]
    assert snapshots[s3].summary.operation.value == "overwrite"
    assert snapshots[s3].summary["total-equality-deletes"] == str(2 + 2 + 3 + 1)
    # every delete file sits in a DELETES manifest with its snapshot's sequence number
    deletes = [m for m in manifests(table) if m.content == ManifestContent.DELETES]
    assert sorted(m.sequence_number for m in deletes) == [2, 3]
    for m in deletes:
        for entry in m.fetch_manifest_entry(table.io):
            assert entry.data_file.content == DataFileContent.EQUALITY_DELETES
            assert entry.data_file.equality_ids == [ID]
            assert entry.sequence_number == m.sequence_number
    data = [m for m in manifests(table) if m.content == ManifestContent.DATA]
    assert sorted(m.sequence_number for m in data) == [1, 2, 3]


def test_pyiceberg_refuses_to_read_the_equality_deletes(iceberg: IcebergFixture) -> None:
    """pyiceberg refuses on the file's content type (wherever the file sits), so this pins the
    pyiceberg behaviour readers depend on; the manifest placement is checked through DuckDB,
    which would read an equality delete file from a DATA manifest as data rows."""
    table = v2_table(iceberg, "refuse")
    table.append(rows((1, "a", 1), (2, "b", 2)))
    write_changes(table, data=None, deletes=keys(1), equality_ids=[ID])
    with pytest.raises(ValueError, match="equality deletes"):
        table.scan().to_arrow()


def test_delete_only_and_data_only_changes(iceberg: IcebergFixture, duck: Any) -> None:
    table = v2_table(iceberg, "ops")
    table.append(rows((1, "a", 1), (2, "b", 2)))
    s_delete = write_changes(table, data=None, deletes=keys(2, 99), equality_ids=[ID])
    s_append = write_changes(table, data=rows((3, "c", 3)), deletes=None, equality_ids=[ID])

    ops = {s.snapshot_id: s.summary.operation.value for s in table.metadata.snapshots}
    assert (ops[s_delete], ops[s_append]) == ("delete", "append")
    assert [r["id"] for r in duck_rows(duck, table)] == [1, 3]
    assert table.current_snapshot().summary["total-delete-files"] == "1"


def test_composite_key_and_delete_file_metadata(iceberg: IcebergFixture, duck: Any) -> None:
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            pa.field("tenant", pa.string(), nullable=False),
            pa.field("id", pa.int64()),
            ("v", pa.int64()),
        ]
    )
    table = v2_table(iceberg, "composite", schema)
    table.append(
        pa.table({"tenant": ["a", "a", "b"], "id": [1, 2, 1], "v": [10, 20, 30]}, schema=schema)
    )
    # key order unlike the schema's (the delete file follows equality_ids: id, tenant); int32
    # keys are cast to the table's long; the column order of ``deletes`` does not matter
    ids = [table.schema().find_field("id").field_id, table.schema().find_field("tenant").field_id]
    deletes = pa.table({"tenant": ["a"], "id": pa.array([1], pa.int32())})
    write_changes(table, data=None, deletes=deletes, equality_ids=ids)

    got = duck.execute(
        f"SELECT tenant, id, v FROM iceberg_scan('{table.metadata_location}') ORDER BY ALL"
    ).fetchall()
    assert got == [("a", 2, 20), ("b", 1, 30)]

    (entry,) = [
        e
        for m in manifests(table)
        if m.content == ManifestContent.DELETES
        for e in m.fetch_manifest_entry(table.io)
    ]
    delete_file = entry.data_file
    path = delete_file.file_path.removeprefix("file://")
    assert delete_file.equality_ids == ids
    assert delete_file.record_count == 1
    assert delete_file.file_size_in_bytes == Path(path).stat().st_size
    file_schema = pq.read_schema(path)
    assert [f.metadata[b"PARQUET:field_id"] for f in file_schema] == [b"%d" % i for i in ids]


def test_schema_evolution_between_changes(iceberg: IcebergFixture, duck: Any) -> None:
    """A column added, and the key column renamed, between two writes: old delete files still
    match by field id, old data files read the new column as null."""
    table = v2_table(iceberg, "evolve")
    oracle = Oracle()
    first = rows((1, "a", 1), (2, "b", 2), (3, "c", 3))
    table.append(first)
    oracle.apply(first)
    second = rows((2, "b2", 22))
    upsert(table, second, delete_ids=[3])
    oracle.apply(second, [3])

    with table.update_schema() as update:
        update.add_column("note", StringType())
    schema = table.schema().as_arrow()
    third = pa.table(
        {"id": [1, 4], "name": ["a3", "d3"], "qty": [100, 4], "note": ["new", None]},
        schema=schema,
    )
    upsert(table, third, delete_ids=[2])
    oracle.apply(third, [2])
    columns = [*SCHEMA.names, "note"]
    assert duck_rows(duck, table) == oracle.expected(columns)

    with table.update_schema() as update:
        update.rename_column("id", "pk")
    fourth = pa.table(
        {"pk": [4], "name": ["d4"], "qty": [44], "note": ["renamed"]},
        schema=table.schema().as_arrow(),
    )
    write_changes(table, data=fourth, deletes=pa.table({"pk": [4, 1]}), equality_ids=[ID])
    oracle.apply(fourth.rename_columns(columns), [4, 1])
    got = duck.execute(
        f"SELECT pk AS id, name, qty, note FROM iceberg_scan('{table.metadata_location}') "
        "ORDER BY pk"
    ).to_arrow_table()
    assert got.to_pylist() == oracle.expected(columns)


# --- position deletes ------------------------------------------------------------------------


def test_position_deletes_read_by_pyiceberg_and_duckdb(iceberg: IcebergFixture, duck: Any) -> None:
    table = v2_table(iceberg, "positions")
    table.append(rows(*[(i, f"r{i}", i) for i in range(5)]))
    (path,) = data_paths(table)
    added = rows((10, "new", 10))
    sid = write_position_deletes(table, {path: [3, 0, 3]}, data=added)

    expected = [
        r for r in rows(*[(i, f"r{i}", i) for i in range(5)]).to_pylist() if r["id"] in (1, 2, 4)
    ]
    expected += added.to_pylist()
    assert duck_rows(duck, table) == expected
    assert table.scan().to_arrow().sort_by("id").to_pylist() == expected  # pyiceberg reads them
    summary = table.metadata.snapshot_by_id(sid).summary
    assert (summary.operation.value, summary["added-position-deletes"]) == ("overwrite", "2")


def test_position_deletes_need_live_data_files(iceberg: IcebergFixture) -> None:
    table = v2_table(iceberg, "positions_missing")
    table.append(rows((1, "a", 1)))
    with pytest.raises(ValueError, match="not live data files"):
        write_position_deletes(table, {"file:///nowhere/x.parquet": [0]})


def data_paths(table: Any) -> list[str]:
    return [
        e.data_file.file_path
        for m in manifests(table)
        if m.content == ManifestContent.DATA
        for e in m.fetch_manifest_entry(table.io)
    ]


# --- refusals --------------------------------------------------------------------------------


def test_format_version_1_is_refused(iceberg: IcebergFixture) -> None:
    table = iceberg.catalog.create_table("db.v1", schema=SCHEMA, properties={"format-version": "1"})
    with pytest.raises(ValueError, match="format-version 2"):
        write_changes(table, data=None, deletes=keys(1), equality_ids=[ID])


def test_partitioned_table_is_not_supported(iceberg: IcebergFixture) -> None:
    table = v2_table(iceberg, "parted")
    with table.update_spec() as update:
        update.add_identity("name")
    with pytest.raises(NotImplementedError, match="partitioned"):
        write_changes(table, data=None, deletes=keys(1), equality_ids=[ID])


@pytest.mark.parametrize(
    ("deletes", "equality_ids", "match"),
    [
        (keys(1), [], "equality_ids"),
        (keys(1), [ID, ID], "equality_ids"),
        (keys(1), [42], "not a top-level field"),
        (pa.table({"name": ["a"]}), [ID], "exactly the key columns"),
        (pa.table({"id": ["x"]}), [ID], "do not fit"),
    ],
)
def test_bad_deletes_are_refused_and_leave_no_files(
    iceberg: IcebergFixture, deletes: pa.Table, equality_ids: list[int], match: str
) -> None:
    table = v2_table(iceberg, "bad")
    table.append(rows((1, "a", 1)))
    before, snapshot = data_dir_files(table), table.current_snapshot().snapshot_id
    with pytest.raises(ValueError, match=match):
        write_changes(table, data=rows((2, "b", 2)), deletes=deletes, equality_ids=equality_ids)
    table.refresh()
    assert table.current_snapshot().snapshot_id == snapshot
    assert data_dir_files(table) == before  # the data file written first was removed


def test_float_keys_and_empty_changes_are_refused(iceberg: IcebergFixture) -> None:
    schema = pa.schema([pa.field("x", pa.float64(), nullable=False)])
    table = v2_table(iceberg, "floats", schema)
    with pytest.raises(ValueError, match="float"):
        write_changes(table, data=None, deletes=pa.table({"x": [1.0]}), equality_ids=[1])
    with pytest.raises(ValueError, match="needs rows"):
        write_changes(v2_table(iceberg, "empty"), data=None, deletes=keys(), equality_ids=[ID])


# --- concurrent writers ----------------------------------------------------------------------


def test_stale_handle_retries_onto_the_new_head(iceberg: IcebergFixture, duck: Any) -> None:
    """A commit from a stale table handle fails its ref check, and pyiceberg re-runs the
    producer on the refreshed table: the delete gets the next sequence number, so it also
    deletes the matching key the other writer added meanwhile (last writer wins)."""
    table = v2_table(iceberg, "stale")
    table.append(rows((1, "a", 1), (2, "b", 2)))
    stale = iceberg.catalog.load_table("db.stale")
    upsert(table, rows((2, "other", 20), (3, "other", 30)))  # sequence number 2

    upsert(stale, rows((3, "mine", 300)), delete_ids=[1])  # retried: sequence number 3
    table.refresh()
    assert table.current_snapshot().sequence_number == 3
    assert [(r["id"], r["name"]) for r in duck_rows(duck, table)] == [(2, "other"), (3, "mine")]


def test_position_deletes_of_a_file_removed_concurrently_fail(iceberg: IcebergFixture) -> None:
    from pyiceberg.exceptions import ValidationException

    table = v2_table(iceberg, "stale_positions")
    table.append(rows((1, "a", 1), (2, "b", 2)))
    stale = iceberg.catalog.load_table("db.stale_positions")
    (path,) = data_paths(stale)
    table.overwrite(rows((1, "a", 1)))  # the data file is rewritten away
    before = data_dir_files(table)

    with pytest.raises(ValidationException, match="removed concurrently"):
        write_position_deletes(stale, {path: [1]})
    assert data_dir_files(table) == before  # the delete file was removed again
    table.refresh()
    assert table.scan().to_arrow().to_pylist() == [{"id": 1, "name": "a", "qty": 1}]
