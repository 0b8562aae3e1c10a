"""``locations.local_real`` (the C library's realpath where there is one) names the same real file
as ``os.path.realpath`` for every shape of path a source can give: the allow-list checks compare
what it returns, so a difference would let a symlink or ``..`` lead a read outside ``reach``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flight_gateway.protocol.errors import InvalidArgument
from planners import locations
from planners.files import resolve_paths


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "root" / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "root" / "sub" / "f.parquet").write_bytes(b"x")
    (tmp_path / "outside" / "secret.parquet").write_bytes(b"x")
    os.symlink(tmp_path / "outside", tmp_path / "root" / "away")  # a link leaving the root
    os.symlink("sub", tmp_path / "root" / "here")  # a relative link
    os.symlink("loop", tmp_path / "root" / "loop")  # a link to itself
    return tmp_path


CASES = [
    "root/sub/f.parquet",
    "root/sub/../sub/f.parquet",
    "root/away/secret.parquet",
    "root/away/../root/sub/f.parquet",  # the link first, then "..": outside, as the kernel goes
    "root/here/f.parquet",
    "root/here/../away",
    "root//sub///f.parquet",
    "root/sub/missing.parquet",  # the C realpath refuses a missing file: Python's answers
    "root/missing/deeper/x",
    "root/loop/x",  # a loop: the C one refuses, Python's resolves as far as it can
    "root/sub/f.parquet/x",  # a file used as a directory
    "root/sub/",
    "root",
]


@pytest.mark.parametrize("case", CASES)
def test_the_same_real_path_as_python(tree: Path, case: str) -> None:
    path = str(tree / case) if not case.endswith("/") else str(tree / case) + "/"
    assert locations.local_real(path) == os.path.realpath(path)


def test_relative_paths_resolve_from_the_working_directory(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tree / "root")
    for case in ("here/f.parquet", "away/secret.parquet", "../root/sub", "."):
        assert locations.local_real(case) == os.path.realpath(case)


def test_the_c_library_is_used_on_linux() -> None:
    if os.uname().sysname != "Linux":
        pytest.skip("the C realpath is only used on Linux")
    assert locations._c_realpath is not None


def test_a_files_source_cannot_leave_its_root_through_a_link(tree: Path) -> None:
    root = str(tree / "root")
    _, paths = resolve_paths(root, ["sub/f.parquet", "here/f.parquet"])
    assert paths == [f"{root}/sub/f.parquet", f"{root}/here/f.parquet"]
    for name in ("away/secret.parquet", "../outside/secret.parquet", str(tree / "outside")):
        with pytest.raises(InvalidArgument, match="outside the source's root"):
            resolve_paths(root, [name])


@pytest.mark.parametrize("name", ["sub/f\x00.parquet", "", 7])
def test_bad_file_names_are_refused_as_invalid(tree: Path, name: object) -> None:
    with pytest.raises(InvalidArgument, match="non-empty strings"):
        resolve_paths(str(tree / "root"), [name])


def test_a_nul_in_a_path_is_never_cut_short() -> None:
    # ctypes would pass "/tmp" for "/tmp\x00/../etc"; the Python fallback refuses it.
    with pytest.raises(ValueError):
        locations.local_real("/tmp\x00/../etc")


def _storage_readings(key: str, paths: list[str]) -> set[locations.Reach]:
    return {r for p in paths for r in locations.storage(key, p)}


@pytest.mark.parametrize("many", [False, True])
def test_files_read_per_directory_as_storage_reads_each(tree: Path, many: bool) -> None:
    """``files`` resolves each directory once (and lists it when it holds many of the files):
    it must reach exactly what ``storage`` of each path reaches, links and ``..`` included, for
    plain paths and ``file:`` URIs (both readings of a percent-encoded one)."""
    (tree / "root" / "sub" / "a b.parquet").write_bytes(b"x")
    os.symlink(tree / "outside" / "secret.parquet", tree / "root" / "sub" / "link.parquet")
    paths = [str(tree / c) for c in CASES if not c.endswith("/")]
    paths += [
        str(tree / "root" / "sub" / "link.parquet"),
        f"file://{tree}/root/sub/a%20b.parquet",
        f"file://{tree}/root/away/secret.parquet",
        f"file://localhost{tree}/root/here/f.parquet",
        "s3://bucket/key/x.parquet",
    ]
    if many:  # past the listing threshold: the directory is read once
        for i in range(40):
            (tree / "root" / "sub" / f"p{i}.parquet").write_bytes(b"x")
            paths.append(str(tree / "root" / "sub" / f"p{i}.parquet"))
    got = locations.files("data file", paths)
    assert set(got) == _storage_readings("data file", paths)
    assert any(r.value == str(tree / "outside" / "secret.parquet") for r in got)
