"""A single-node Trino server for tests and benchmarks (``flight_gateway.local.engines`` fetches
it), on a free loopback port, with dynamic catalogs: a test points a catalog at its own gateway's
Iceberg REST face (``CREATE CATALOG ... USING iceberg``) and drops it afterwards, so one server
serves a whole test session.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from flight_gateway.local.engines import java_home, trino_home
from flight_gateway.protocol.errors import Unavailable

log = logging.getLogger(__name__)
JDK = 24  # Trino 476's minimum

_JVM_CONFIG = """-server
-Xmx{heap_mb}M
-XX:+UseG1GC
-XX:+ExitOnOutOfMemoryError
-Djdk.attach.allowAttachSelf=true
-XX:+EnableDynamicAgentLoading
--add-modules=jdk.incubator.vector
--enable-native-access=ALL-UNNAMED
"""
_CONFIG = """coordinator=true
node-scheduler.include-coordinator=true
http-server.http.port={port}
discovery.uri=http://127.0.0.1:{port}
catalog.management=dynamic
query.max-memory={query_mb}MB
query.max-memory-per-node={query_mb}MB
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Trino:
    port: int
    home: Path
    started_s: float  # from launch until it answered "started"

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connect(
        self, catalog: str = "system", schema: str = "runtime", user: str = "test"
    ) -> object:
        """A DBAPI connection (the ``trino`` client)."""
        import trino.dbapi

        return trino.dbapi.connect(host="127.0.0.1", port=self.port, user=user,
                                   catalog=catalog, schema=schema)  # fmt: skip

    def execute(self, sql: str) -> list[tuple]:
        conn = self.connect()
        try:
            cur = conn.cursor()  # type: ignore[attr-defined]
            cur.execute(sql)
            return [tuple(r) for r in cur.fetchall()]
        finally:
            conn.close()  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def iceberg_catalog(self, name: str, rest_uri: str, token: str | None = None) -> Iterator[str]:
        """An Iceberg catalog ``name`` on a REST endpoint (local files read in place)."""
        props = {
            "iceberg.catalog.type": "rest",
            "iceberg.rest-catalog.uri": rest_uri,
            "fs.native-local.enabled": "true",
            "local.location": "/",
        }
        if token is not None:
            props["iceberg.rest-catalog.security"] = "OAUTH2"
            props["iceberg.rest-catalog.oauth2.token"] = token
        with_ = ", ".join(f'"{k}" = {_literal(v)}' for k, v in props.items())
        self.execute(f"CREATE CATALOG {name} USING iceberg WITH ({with_})")
        try:
            yield name
        finally:
            self.execute(f"DROP CATALOG IF EXISTS {name}")


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/info", timeout=5) as r:
            return json.loads(r.read()).get("starting") is False
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def trino_server(heap_mb: int = 1536, startup_timeout_s: float = 240) -> Iterator[Trino]:
    """Start Trino; yields it once it answers; stops it (and removes its files) afterwards."""
    home, jdk = trino_home(), java_home(JDK)
    work = Path(tempfile.mkdtemp(prefix="harness-trino-"))
    etc, data = work / "etc", work / "data"
    (etc / "catalog").mkdir(parents=True)
    data.mkdir()
    port = _free_port()
    (etc / "jvm.config").write_text(_JVM_CONFIG.format(heap_mb=heap_mb))
    (etc / "config.properties").write_text(_CONFIG.format(port=port, query_mb=heap_mb // 2))
    (etc / "node.properties").write_text(
        f"node.environment=test\nnode.id=harness-{port}\nnode.data-dir={data}\n"
    )
    (etc / "log.properties").write_text("io.trino=WARN\n")
    env = {**os.environ, "JAVA_HOME": str(jdk), "PATH": f"{jdk / 'bin'}:{os.environ['PATH']}"}
    log_file = open(work / "server.log", "wb")  # noqa: SIM115 - closed below
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(home / "bin" / "launcher"), "run", f"--etc-dir={etc}", f"--data-dir={data}"],
        stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        while not _ready(port):
            if proc.poll() is not None or time.monotonic() - started > startup_timeout_s:
                tail = (work / "server.log").read_text(errors="replace")[-3000:]
                raise Unavailable(f"Trino did not start (exit {proc.poll()}):\n{tail}")
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        log.info("Trino on port %d, started in %.1f s", port, elapsed)
        yield Trino(port, home, elapsed)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log_file.close()
        shutil.rmtree(work, ignore_errors=True)
