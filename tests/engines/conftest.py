"""JVM engines for the tests (``flight_gateway.local``): fetched from Maven Central once, one
Trino server per test session. Missing ones skip, or fail under ``HARNESS_REQUIRE_SERVICES``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from flight_gateway.protocol.errors import Unavailable
from tests.services import missing


@pytest.fixture(scope="session")
def trino() -> Iterator[Any]:
    from flight_gateway.local.trino import trino_server

    try:
        server = trino_server()
        running = server.__enter__()
    except Unavailable as e:
        missing(f"Trino: {e}")
        return
    try:
        yield running
    finally:
        server.__exit__(None, None, None)
