"""Flink SQL with Iceberg's Flink runtime (Flink 2.1.1 and ``iceberg-flink-runtime-2.1:1.11.0``
from Maven Central, embedded in a small Java program, ``FlinkProbe.java``) reads harness tables
through the gateway's Iceberg REST face: the latest version and an earlier one by snapshot id,
equal to the harness's own reads."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from flight_gateway.protocol.errors import Unavailable
from tests.engines.two_versions import two_versions
from tests.services import missing

pytestmark = pytest.mark.integration
PROBE = Path(__file__).with_name("FlinkProbe.java")


def test_flink_with_icebergs_runtime_reads_pinned_versions(tmp_path: Path, pg_dsn: str) -> None:
    from flight_gateway.local.engines import flink_classpath, java_home

    try:
        classpath, jdk = flink_classpath(), java_home(17, 21)  # Flink 2.1's JDKs
    except Unavailable as e:
        missing(f"Flink with Iceberg's runtime: {e}")
    with two_versions(tmp_path, pg_dsn) as t:
        out = subprocess.run(
            [str(jdk / "bin" / "java"), "-cp", classpath, str(PROBE), t.rest, "t",
             str(t.v1_snapshot)],
            capture_output=True, text=True, timeout=600, cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
        assert sorted(got["latest"]) == t.rows(t.v2)
        assert sorted(got["old"]) == t.rows(t.v1)
        assert sorted(got["old"]) != sorted(got["latest"])
