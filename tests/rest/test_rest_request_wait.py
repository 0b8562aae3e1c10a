"""An engine loading more tables at once than a principal may have requests answered (Trino
loads up to 8 per query): the requests over ``max_requests_per_principal`` wait for a place
(``request_wait_s``) instead of failing 503, which pyiceberg does not retry."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flight_gateway.core.config import ConfigError, RestSettings
from tests.gateway.helpers import client_for
from tests.rest.helpers import get, versioned_pg_table
from tests.rest.test_rest_bad_input import ADMIN, _gateway, _table

pytestmark = pytest.mark.integration


def test_loads_past_the_principals_limit_wait_for_a_place(tmp_path: Path) -> None:
    with _gateway(tmp_path, max_requests_per_principal=2) as (server, _):
        admin = client_for(server, ADMIN)
        _table(admin, tmp_path / "f")
        url = f"http://127.0.0.1:{server.rest.port}/v1/namespaces/harness/tables/t"
        assert get(url, ADMIN)[0] == 200  # its layout made once, before the burst
        start = threading.Barrier(4)  # 2 answered, 2 waiting (as many as may be answered)
        answers: list[tuple[int, Any]] = []

        def load() -> None:
            start.wait()
            answers.append(get(url, ADMIN))

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [status for status, _ in answers] == [200] * 4, answers
        admin.close()


@pytest.mark.parametrize("value", [-1.0, float("inf"), float("nan"), True, "2"])
def test_request_wait_s_must_be_a_finite_number_not_below_0(value: Any) -> None:
    with pytest.raises(ConfigError, match="request_wait_s"):
        RestSettings.from_json({"request_wait_s": value})
    assert RestSettings.from_json({"request_wait_s": 0}).request_wait_s == 0


def test_requests_waiting_for_a_place_hold_no_thread(tmp_path: Path, pg_dsn: str) -> None:
    """Principal a's loads wait on a PostgreSQL table locked elsewhere, and more of its
    requests wait for a place among its own. Those waited on a pool thread: the 2 threads of
    the quick routes were soon all a's, and b's config request queued behind them until a's
    waits ended. Now they wait on the event loop, and b is answered at once."""
    import psycopg

    a, b = "token-a-0123456789", "token-b-0123456789"
    tokens = {a: {"name": "a", "admin": ["*"]}, b: {"name": "b", "read": ["x"]}}
    pg, as_of = versioned_pg_table(pg_dsn, "VALUES (1, 'r')")
    limits = {"max_requests_per_principal": 4, "max_loads_per_principal": 4,
              "max_concurrent_loads": 4, "request_wait_s": 30}  # fmt: skip
    with _gateway(tmp_path, tokens, **limits) as (server, _):
        admin = client_for(server, a)
        admin.create_table("x", [{"name": "id", "type": "int64"}, {"name": "region", "type": "string"}])  # fmt: skip
        admin.add_source("x", "p", "postgres", config={"dsn": pg_dsn, "table": pg},
                         state={"as_of": as_of})  # fmt: skip
        base = f"http://127.0.0.1:{server.rest.port}/v1"
        answers: list[tuple[str, int]] = []

        def call(what: str, url: str) -> None:
            answers.append((what, get(url, a)[0]))

        with psycopg.connect(pg_dsn) as locker:  # a transaction holding the lock until rollback
            locker.execute(f'LOCK TABLE "{pg}" IN ACCESS EXCLUSIVE MODE')
            loads = [threading.Thread(target=call, args=("load", f"{base}/namespaces/harness/tables/x"))
                     for _ in range(4)]  # fmt: skip
            for t in loads:
                t.start()
            time.sleep(1.0)  # a's four places taken by loads waiting on the lock
            waiting = [threading.Thread(target=call, args=("config", f"{base}/config"))
                       for _ in range(4)]  # fmt: skip
            for t in waiting:
                t.start()
            time.sleep(0.5)
            started = time.monotonic()
            status, _ = get(f"{base}/config", b)
            answered_in = time.monotonic() - started
            locker.rollback()
        for t in loads + waiting:
            t.join(60)
        assert status == 200
        assert answered_in < 10, answered_in  # it waited for a's requests (up to 30 s) before
        assert sorted(answers) == [("config", 200)] * 4 + [("load", 200)] * 4, answers
        admin.close()
