"""A source kind the project does not ship (``tests/plugins/harness_jsonl``), installed as its own
package and found through the ``dataharness.sources`` entry point, read and written through the
gateway and the Python client with no edit to the project's code."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import InvalidArgument
from planners import registry

SCHEMA = [
    {"name": "id", "type": "int64"},
    {"name": "name", "type": "string"},
    {"name": "amount", "type": "double"},
]


def rows(ids: range) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(list(ids), pa.int64()),
            "name": [f"n{i}" for i in ids],
            "amount": [i / 2 for i in ids],
        }
    )


def ids_of(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


@pytest.fixture
def log_table(jsonl_kind: str, client: HarnessClient, tmp_path: Path) -> Path:
    path = tmp_path / "log.jsonl"
    client.create_table("t", SCHEMA)
    client.add_source(
        "t", "log", jsonl_kind, config={"path": str(path)}, state={"lines": 0, "bytes": 0}
    )
    return path


def test_the_kind_is_found_through_its_entry_point(jsonl_kind: str) -> None:
    assert jsonl_kind in registry.available()
    kind = registry.get_kind(jsonl_kind)
    assert type(kind).__module__ == "harness_jsonl"  # not part of this project


def test_append_read_pin_and_filter(client: HarnessClient, log_table: Path) -> None:
    v1 = client.put("t", rows(range(0, 10)))["version"]
    v2 = client.put("t", rows(range(10, 25)))["version"]
    assert ids_of(client.read("t")) == list(range(25))
    assert ids_of(client.read("t", version=v1)) == list(range(10))  # pinned
    got = client.read("t", columns=["name"], filter="id >= 20 AND amount < 12")
    assert got.column_names == ["name"] and sorted(got.column("name").to_pylist()) == [
        "n20",
        "n21",
        "n22",
        "n23",
    ]
    info = client.describe("t", version=v2)
    assert info.source("log").kind == "jsonl" and info.source("log").state["lines"] == 25


def test_append_is_idempotent_and_uncommitted_tails_stay_invisible(
    client: HarnessClient, log_table: Path
) -> None:
    client.put("t", rows(range(0, 5)), commit_id="c1")
    again = client.put("t", rows(range(0, 5)), commit_id="c1")  # a retry after a lost reply
    assert again["applied"] is False
    # A try that wrote its lines but died before its harness commit:
    with open(log_table, "ab") as f:
        f.write(b'{"id": 999, "name": "ghost", "amount": 0, "_commit": "lost"}\n')
    assert ids_of(client.read("t")) == list(range(5))
    client.put("t", rows(range(5, 8)), commit_id="c2")  # cuts the tail off before writing
    assert ids_of(client.read("t")) == list(range(8))
    assert b"ghost" not in log_table.read_bytes()


def test_added_rows_between_versions(client: HarnessClient, log_table: Path) -> None:
    v1 = client.put("t", rows(range(0, 4)))["version"]
    client.put("t", rows(range(4, 6)))
    v3 = client.put("t", rows(range(6, 9)))["version"]
    info = client.flight_info("t", version=v3, since=v1)
    added = pa.concat_tables([client.read_endpoint(ep).read_all() for ep in info.endpoints])
    assert ids_of(added) == list(range(4, 9))


def test_bad_config_and_state_are_rejected_by_the_kind(
    client: HarnessClient, log_table: Path
) -> None:
    with pytest.raises(InvalidArgument, match="config needs \\['path'\\]"):
        client.add_source("t", "other", "jsonl", config={})
    with pytest.raises(InvalidArgument, match="'lines' and 'bytes'"):
        client.add_source("t", "other", "jsonl", config={"path": "x"}, state={"lines": -1})
