"""Spark with Apache Hudi's Spark bundle, for tests and benchmarks: the writer of the Hudi tables
the ``hudi`` kind reads, and the independent reader its rows are compared to.

One Spark (pyspark 3.5 in an environment of its own, the bundle from Maven Central, a JDK 17;
``flight_gateway.local.engines`` fetches them) runs ``hudi_spark_worker.py`` for a whole test
session; each request is one JSON line, answered by one. Starting Spark takes seconds, a write
about one: a session's tables share it.
"""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from flight_gateway.local.engines import HUDI_SPARK, fetch, java_home, spark_python
from flight_gateway.protocol.errors import Unavailable

log = logging.getLogger(__name__)
WORKER = Path(__file__).with_name("hudi_spark_worker.py")
MARK = "@@hudi "
COW, MOR = "COPY_ON_WRITE", "MERGE_ON_READ"


class HudiSpark:
    """A running Spark with Hudi's bundle. ``write`` and ``read`` may be called from any thread
    (one request at a time)."""

    def __init__(self, startup_s: float = 600) -> None:
        bundle, python, jdk = fetch(HUDI_SPARK), spark_python("3.5.7"), java_home(17, 17)
        self._scratch = tempfile.TemporaryDirectory(prefix="hudi-spark-")
        env = {
            "JAVA_HOME": str(jdk),
            "PATH": f"{jdk / 'bin'}:/usr/bin:/bin",
            "HOME": self._scratch.name,
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        self._log = open(Path(self._scratch.name) / "spark.log", "wb")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [str(python), str(WORKER), str(bundle)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            text=True, env=env, cwd=self._scratch.name,
        )  # fmt: skip
        self._lock = threading.Lock()
        self._ids = itertools.count(1)  # next() is atomic: callers may be on any thread
        self._answer(startup_s)

    def _answer(self, timeout_s: float) -> dict[str, Any]:
        out: IO[str] | None = self._proc.stdout
        assert out is not None
        result: list[str] = []

        def wait() -> None:
            for line in out:
                if line.startswith(MARK):
                    result.append(line[len(MARK) :])
                    return

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        t.join(timeout_s)
        if not result:
            self._proc.kill()  # its answer may still come: nothing may read it as the next one
            raise Unavailable(f"Spark with Hudi did not answer: {self._tail()}")
        answer: dict[str, Any] = json.loads(result[0])
        if "error" in answer:
            raise RuntimeError(f"Spark with Hudi: {answer['error']}\n{answer.get('trace', '')}")
        return answer

    def _tail(self) -> str:
        self._log.flush()
        text = (Path(self._scratch.name) / "spark.log").read_text(errors="replace")
        return text[-3000:]

    def _request(self, req: Mapping[str, Any], timeout_s: float = 600) -> dict[str, Any]:
        with self._lock:
            if self._proc.poll() is not None:
                raise Unavailable(f"Spark with Hudi exited: {self._tail()}")
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(req) + "\n")
            self._proc.stdin.flush()
            return self._answer(timeout_s)

    def _staged(self, rows: pa.Table) -> str:
        path = str(Path(self._scratch.name) / f"rows-{next(self._ids)}.parquet")
        pq.write_table(rows, path)
        return path

    def write(
        self,
        path: str,
        rows: pa.Table,
        *,
        operation: str = "insert",
        table_type: str = COW,
        key: str = "id",
        precombine: str | None = None,
        partition: str | None = None,
        options: Mapping[str, str] | None = None,
    ) -> str:
        """Write ``rows`` to the Hudi table at ``path`` (made by the first write) with Hudi's
        ``operation``; the instant of the commit it made."""
        req = {
            "op": "write", "path": path, "data": self._staged(rows), "operation": operation,
            "table_type": table_type, "key": key, "precombine": precombine,
            "partition": partition, "options": dict(options or {}), "name": Path(path).name,
        }  # fmt: skip
        return str(self._request(req)["instant"])

    def read(self, path: str, instant: str | None = None) -> pa.Table:
        """Spark's own snapshot read of the table at ``instant`` (None: the latest), without
        Hudi's meta columns."""
        out = str(Path(self._scratch.name) / f"read-{next(self._ids)}")
        self._request({"op": "read", "path": path, "instant": instant, "out": out})
        return pq.read_table(out)

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        self._scratch.cleanup()

    def __enter__(self) -> HudiSpark:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
