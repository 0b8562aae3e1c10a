"""Property: for generated locations — percent-encoded, relative, through symlinks, with query
strings and fragments — in every kind's location keys, ``reach`` decides as the plain resolved
paths the libraries would open: it never allows a location any library reading would resolve
outside the allowed root, and it allows every plain location that resolves inside.

The oracle is the libraries' own reading: pyarrow's ``FileSystem.from_uri`` (which
percent-decodes ``file:`` URIs) and pyiceberg's file IO (which does not), each resolved with
``os.path.realpath``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow.fs as pafs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flight_gateway.core.reach import ReachPolicy
from flight_gateway.protocol.errors import InvalidArgument
from planners.kind import SourceRef
from planners.registry import get_kind

SEGMENTS = ["a", "b", "..", ".", "%2e%2e", "%2E%2e", "%2f..", "link_out", "link_in", "%61", ""]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reach")
    for d in ("allowed/a/b", "allowed/b", "outside/a", "outside/b", "allowed/%2e%2e"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "allowed" / "link_out").symlink_to(root / "outside")
    (root / "allowed" / "link_in").symlink_to(root / "allowed" / "a")
    (root / "allowed" / "a" / "link_out").symlink_to(root / "outside")
    return root


def _configs(location: str, tree: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every kind's key that names a storage location, set to ``location``."""
    inside_db = f"sqlite:///{tree / 'allowed' / 'cat.db'}"
    return [
        ("files", {"root": location}),
        ("iceberg", {"catalog": {"type": "sql", "uri": inside_db, "warehouse": location},
                     "identifier": "db.t"}),
        ("delta", {"uri": location}),
        ("hudi", {"uri": location}),
        ("hudi", {"uri": str(tree / "allowed"), "storage_options": {"hoodie.base.path": location}}),
        ("paimon", {"warehouse": location, "identifier": "db.t"}),
        ("ducklake", {"metadata": f"sqlite:{tree / 'allowed' / 'lake.db'}", "table": "t",
                      "data_path": location}),
    ]  # fmt: skip


def _readings(location: str) -> set[str]:
    """The real paths pyarrow and pyiceberg would open for ``location``."""
    if not location.startswith("file:"):
        return {os.path.realpath(location)}
    decoded = pafs.FileSystem.from_uri(location)[1]
    raw = urlsplit(location).path
    return {os.path.realpath(decoded), os.path.realpath(raw)}


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def _decision(policy: ReachPolicy, kind_name: str, config: dict[str, Any]) -> bool:
    kind = get_kind(kind_name)
    try:
        reaches = kind.reaches(SourceRef("s", kind_name, config, {}, {}))
    except InvalidArgument:
        return False
    return all(policy.allows(kind_name, r) for r in reaches)


@st.composite
def locations(draw: st.DrawFn, tree: Path) -> tuple[str, bool]:
    """(location, plain): plain locations have no query, fragment or percent-encoding."""
    parts = draw(st.lists(st.sampled_from(SEGMENTS), max_size=6))
    base = draw(st.sampled_from(["allowed", "outside", "allowed/a", "allowed/link_out"]))
    path = "/".join([str(tree / base), *parts])
    form = draw(st.sampled_from(["path", "relative", "file", "file-query", "file-fragment"]))
    if form == "relative":
        return os.path.relpath(path), "%" not in path
    if form == "path":
        return path, "%" not in path
    suffix = {"file": "", "file-query": "?endpoint_override=x", "file-fragment": "#f"}[form]
    return f"file://{path}{suffix}", form == "file" and "%" not in path


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_reach_decides_as_the_resolved_path(tree: Path, data: st.DataObject) -> None:
    allowed = os.path.realpath(tree / "allowed")
    policy = ReachPolicy.from_json({"paths": [allowed]})
    location, plain = data.draw(locations(tree))
    try:
        inside = all(_inside(p, allowed) for p in _readings(location))
    except (OSError, ValueError, TypeError):
        inside = False  # pyarrow cannot open it at all
    for kind_name, config in _configs(location, tree):
        allowed_here = _decision(policy, kind_name, config)
        assert not allowed_here or inside, (kind_name, location)  # never allows an escape
        if plain:
            assert allowed_here == inside, (kind_name, location)


@pytest.mark.parametrize(
    ("host", "allowed", "ok"),
    [
        ("127.0.0.1:5432", "127.0.0.1:5432", True),
        ("127.1:5432", "127.0.0.1:5432", True),  # inet_aton shorthand, as getaddrinfo reads it
        ("2130706433:5432", "127.0.0.1:5432", True),
        ("0x7f.0.0.1:5432", "127.0.0.1", True),
        ("LOCALHOST.:5432", "localhost:5432", True),
        ("[::1]:5432", "[0:0:0:0:0:0:0:1]:5432", True),
        ("127.0.0.2:5432", "127.0.0.1", False),
        ("127.0.0.1:5433", "127.0.0.1:5432", False),
    ],
)
def test_hosts_compare_in_canonical_form(host: str, allowed: str, ok: bool) -> None:
    policy = ReachPolicy.from_json({"hosts": [allowed]})
    reaches = get_kind("kafka").reaches(
        SourceRef("s", "kafka", {"bootstrap_servers": host, "topic": "t", "partition": 0}, {}, {})
    )
    assert all(policy.allows("kafka", r) for r in reaches) is ok


@pytest.mark.parametrize(
    ("uri", "ok"),
    [
        ("http://registry:8081/", True),
        ("http://REGISTRY:8081/a/b", True),
        ("http://user:pw@registry:8081/", True),  # userinfo does not change where it goes
        ("http://registry:8081/%2e%2e/", False),
        ("http://registry.evil:8081/", False),
        ("http://registry:8081@evil/", False),
        ("https://registry:8081/", False),
    ],
)
def test_service_uris_compare_decoded(uri: str, ok: bool) -> None:
    policy = ReachPolicy.from_json({"uris": ["http://registry:8081/"], "hosts": ["127.0.0.1:9"]})
    config = {"bootstrap_servers": "127.0.0.1:9", "topic": "t", "partition": 0,
              "schema_registry_url": uri}  # fmt: skip
    assert _decision(policy, "kafka", config) is ok
