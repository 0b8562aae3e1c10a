"""Spark with Iceberg's own Spark runtime (``iceberg-spark-runtime-4.1_2.13:1.11.0`` from Maven
Central, on pyspark 4.1 in an environment of its own: the runtime supports Spark up to 4.1) reads
harness tables through the gateway's Iceberg REST face, a Spark user's most common route: the
latest version and an earlier one by snapshot id, equal to the harness's own reads."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from flight_gateway.protocol.errors import Unavailable
from tests.engines.two_versions import two_versions
from tests.services import missing

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).with_name("spark_iceberg_read.py")


def test_spark_with_icebergs_runtime_reads_pinned_versions(tmp_path: Path, pg_dsn: str) -> None:
    from flight_gateway.local.engines import ICEBERG_SPARK, fetch, java_home, spark_python

    try:
        # Spark 4.1 runs on JDK 17-21 (Hadoop's login fails on 23+).
        runtime, python, jdk = fetch(ICEBERG_SPARK), spark_python(), java_home(17, 21)
    except Unavailable as e:
        missing(f"Spark with Iceberg's runtime: {e}")
    with two_versions(tmp_path, pg_dsn) as t:
        env = {"JAVA_HOME": str(jdk), "PATH": f"{jdk / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
        out = subprocess.run(
            [str(python), str(SCRIPT), str(runtime), t.rest, "t", str(t.v1_snapshot)],
            capture_output=True, text=True, timeout=600, env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert sorted(got["latest"]) == t.rows(t.v2)
        assert sorted(got["old"]) == t.rows(t.v1)
        assert sorted(got["old"]) != sorted(got["latest"])
