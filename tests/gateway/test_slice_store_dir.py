"""The slice store's directory, when the gateway made it itself (no ``iceberg_rest_dir``), goes
with the gateway: nothing else knows its name, and each gateway left one behind in the
temporary directory before (412 of them, up to 11 MB each, after a day of test runs here). A
directory the operator named stays."""

from __future__ import annotations

from pathlib import Path

from tests.gateway.helpers import running_gateway


def test_a_slice_store_the_gateway_made_is_removed_at_shutdown(tmp_path: Path) -> None:
    with running_gateway(f"sqlite:///{tmp_path / 'catalog.db'}") as (server, _):
        root = server.core.layouts.store.root
        assert (root / "index.db").exists()
    assert not root.exists()


def test_a_named_slice_store_stays(tmp_path: Path) -> None:
    named = tmp_path / "slices"
    with running_gateway(f"sqlite:///{tmp_path / 'catalog.db'}",
                         iceberg_rest_dir=str(named)) as (server, _):  # fmt: skip
        assert server.core.layouts.store.root == named
    assert (named / "index.db").exists()
