"""An engine loading more tables at once than a principal may have requests answered (Trino
loads up to 8 per query): the requests over ``max_requests_per_principal`` wait for a place
(``request_wait_s``) instead of failing 503, which pyiceberg does not retry."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from flight_gateway.core.config import ConfigError, RestSettings
from tests.gateway.helpers import client_for
from tests.rest.helpers import get
from tests.rest.test_rest_bad_input import ADMIN, _gateway, _table

pytestmark = pytest.mark.integration


def test_loads_past_the_principals_limit_wait_for_a_place(tmp_path: Path) -> None:
    with _gateway(tmp_path, max_requests_per_principal=2) as (server, _):
        admin = client_for(server, ADMIN)
        _table(admin, tmp_path / "f")
        url = f"http://127.0.0.1:{server.rest.port}/v1/namespaces/harness/tables/t"
        assert get(url, ADMIN)[0] == 200  # its layout made once, before the burst
        start = threading.Barrier(8)
        answers: list[tuple[int, Any]] = []

        def load() -> None:
            start.wait()
            answers.append(get(url, ADMIN))

        threads = [threading.Thread(target=load) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [status for status, _ in answers] == [200] * 8, answers
        admin.close()


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), True, "2"])
def test_request_wait_s_must_be_a_finite_positive_number(value: Any) -> None:
    with pytest.raises(ConfigError, match="request_wait_s"):
        RestSettings.from_json({"request_wait_s": value})
