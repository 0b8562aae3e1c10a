"""The test session brings its own PostgreSQL when none answers, and never touches one that does
(DESIGN §20, flight_gateway/local/postgres.py).

Each case runs a real test session (a Postgres test module under pytest, in a subprocess) with
its own services directory, so what it starts, and what it leaves behind, can be seen there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from flight_gateway.local import postgres as local_postgres
from tests.services import missing, postgres_servers

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PROBE = "tests/catalog/test_round_trips.py"  # a few quick tests that need pg_dsn


@pytest.fixture
def services() -> Iterator[Path]:
    """A fresh services directory. Not under pytest's tmp_path: as root the server runs as
    nobody, which cannot traverse /tmp/pytest-of-root."""
    path = Path(tempfile.mkdtemp(prefix="harness-services-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _dsn(port: int) -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def _session(dsn: str, services: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HARNESS_PG_DSN": dsn,
        "HARNESS_SERVICES_DIR": str(services),
        "HARNESS_REQUIRE_SERVICES": "1",
    }
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    return out


def test_a_running_server_is_used_and_nothing_is_started(services: Path) -> None:
    try:
        servers = local_postgres.extra_servers(1)
        (dsn,) = servers.__enter__()
    except local_postgres.Unavailable as e:
        missing(str(e))
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            started = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
        out = _session(dsn, services)
        assert "already running; used as it is" in out.stdout
        # Any server this package starts lives in the services directory: nothing was put there.
        assert not [p.name for p in services.iterdir() if p.name.startswith("postgres-1")]
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT pg_postmaster_start_time()").fetchone() == started
    finally:
        servers.__exit__(None, None, None)


def test_nothing_answering_brings_one_up_and_stops_it(services: Path) -> None:
    port = local_postgres._free_port()
    out = _session(_dsn(port), services)
    assert f"PostgreSQL 18.6 at 127.0.0.1:{port} (started for this run" in out.stdout
    assert not local_postgres.answering("127.0.0.1", port)
    (data,) = services.glob(f"postgres-*/main-{port}")
    assert (data / "PG_VERSION").read_text().strip() == "18"
    assert local_postgres._postmaster_pid(data) is None
    # Idempotent: a second session reuses the binaries and the template (no second initdb).
    template = next(services.glob("postgres-*/template"))
    made = template.stat().st_mtime_ns
    _session(_dsn(port), services)
    assert template.stat().st_mtime_ns == made
    assert not local_postgres.answering("127.0.0.1", port)


def test_the_last_user_stops_a_shared_server(
    services: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes share the server one of them started; it stops when the last one leaves,
    whichever started it."""
    monkeypatch.setenv("HARNESS_SERVICES_DIR", str(services))
    dsn = _dsn(local_postgres._free_port())
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\nfrom flight_gateway.local.postgres import session_server\n"
         f"with session_server({dsn!r}) as r:\n    print(r.how, flush=True)\n    sys.stdin.read()"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "started"
        with local_postgres.session_server(dsn) as mine:
            assert mine.how == "shared"
            with psycopg.connect(dsn, autocommit=True) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
        e = local_postgres.Endpoint.of(dsn)
        assert local_postgres.answering(e.host, e.port)  # the holder still uses it
        holder.stdin.close()
        assert holder.wait(60) == 0
        assert not local_postgres.answering(e.host, e.port)
    finally:
        holder.kill()


def test_the_same_path_as_an_ordinary_user(services: Path) -> None:
    """As root the server runs as nobody; as any other user it runs as that user. Run the
    start/stop commands as an ordinary user too, when we are root and it can reach the code."""
    if os.geteuid() != 0:
        pytest.skip("not root: the whole session already ran as an ordinary user")
    import pwd

    nobody = pwd.getpwnam("nobody")
    setpriv = shutil.which("setpriv")
    as_nobody = [f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
    as_nobody = [setpriv, *as_nobody] if setpriv else []
    probe = subprocess.run([*as_nobody, sys.executable, "-c", "import flight_gateway"], cwd=ROOT,
                           capture_output=True)  # fmt: skip
    if not setpriv or probe.returncode != 0:
        pytest.skip("user nobody cannot run this checkout's interpreter (a private home)")
    services.chmod(0o755)
    home = services / "nobody"
    home.mkdir()
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    env = {**os.environ, "HARNESS_SERVICES_DIR": str(home / "svc"),
           "HARNESS_PG_DSN": _dsn(local_postgres._free_port())}  # fmt: skip

    def run(command: str) -> str:
        out = subprocess.run(
            [*as_nobody, sys.executable, "-m", "flight_gateway.local.postgres", command],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    assert "PostgreSQL 18.6" in run("start")
    assert "PostgreSQL 18.6" in run("status")
    run("stop")
    assert "nothing" in run("status")
    assert {p.stat().st_uid for p in (home / "svc").rglob("*")} == {nobody.pw_uid}


def test_a_started_server_takes_the_connections_of_replicas() -> None:
    """A gateway's catalog may hold 104 connections at its peak (docs/operations.md): a
    server started here takes more than the default 100, so a second gateway or a fresh
    one's first burst is not refused."""
    with postgres_servers(1) as (dsn,), psycopg.connect(dsn, autocommit=True) as conn:
        (value,) = conn.execute("SHOW max_connections").fetchone()
    assert int(value) == local_postgres.MAX_CONNECTIONS > 2 * 104
