"""The gateway's own config file is checked like ``apply``'s YAML: a wrong key is one line
naming the file, the key and the closest setting, and ``serve`` exits 2 (it ended with a
Python traceback: ``GatewayConfig.__init__() got an unexpected keyword argument``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"iceberg_rest": {"port": 1}},
            "iceberg_rest: port: unknown setting (did you mean iceberg_rest_port?)",
        ),
        (
            {"iceberg_rest": {"disk_budget": 1}},
            "iceberg_rest: disk_budget: unknown setting (did you mean disk_budget_mb?)",
        ),
        (
            {"limits": {"max_stream_per_principal": 2}},
            "limits: max_stream_per_principal: unknown setting (did you mean max_streams_per_principal?)",
        ),
        (
            {"limits": {"kinds": {"kafka": {"max_consumer": 2}}}},
            "limits.kinds.kafka: unknown settings ['max_consumer']",
        ),
        ({"tls_cert": "x.pem"}, "tls_cert and tls_key go together"),
    ],
)
def test_a_wrong_setting_is_one_line_and_exit_2(tmp_path: Path, config: dict, message: str) -> None:
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps({"catalog": f"sqlite:///{tmp_path / 'c.db'}", **config}))
    out = subprocess.run(
        [sys.executable, "-m", "flight_gateway.cli", "serve", "--config", str(path),
         "--allow-anonymous", "--port", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert message in out.stderr
    assert "Traceback" not in out.stderr
