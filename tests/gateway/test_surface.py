"""The rest of the Flight surface, file formats, streaming reads and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.flight as fl
import pyarrow.orc as orc
import pytest

from clients import HarnessClient
from flight_gateway.local.kafka import free_port

DATA = pa.table({"id": pa.array(range(20), pa.int64()), "name": [f"n{i}" for i in range(20)]})
SCHEMA = [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}]


@pytest.mark.parametrize("fmt", ["parquet", "orc", "arrow", "csv"])
def test_file_formats(client: HarnessClient, tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"data.{fmt}"
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(DATA, path)
    elif fmt == "orc":
        orc.write_table(DATA, path)
    elif fmt == "arrow":
        feather.write_feather(DATA, path)
    else:
        pacsv.write_csv(DATA, path)
    client.create_table("t", SCHEMA)
    client.add_source(
        "t",
        "f",
        "files",
        config={"format": fmt, "root": str(tmp_path)},
        state={"files": [path.name]},
    )
    got = client.read("t", filter="id >= 15").sort_by("id")
    assert got.column("name").to_pylist() == [f"n{i}" for i in range(15, 20)]


def test_schema_list_flights_actions_and_batches(
    gateway, client: HarnessClient, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    for i in range(3):
        pq.write_table(DATA.slice(i * 5, 5), tmp_path / f"p{i}.parquet")
    client.create_table("t", SCHEMA)
    client.add_source(
        "t",
        "f",
        "files",
        config={"root": str(tmp_path), "target_task_bytes": 1},
        state={"files": [f"p{i}.parquet" for i in range(3)]},
    )
    server, _ = gateway
    with fl.connect(f"grpc://127.0.0.1:{server.port}") as raw:
        schema = raw.get_schema(
            fl.FlightDescriptor.for_command(
                json.dumps({"table": "t", "columns": ["name"]}).encode()
            )
        ).schema
        assert schema.names == ["name"]
        flights = list(raw.list_flights())
        assert [f.descriptor.path for f in flights] == [[b"t"]]
        assert json.loads(flights[0].app_metadata)["version"] == 1
        assert {a.type for a in raw.list_actions()} >= {
            "harness.commit",
            "harness.lock",
            "harness.describe",
        }
    info = client.flight_info("t")
    assert len(info.endpoints) == 3  # one task per file at this target size
    batches = list(client.read_batches("t", limit=7))
    assert sum(b.num_rows for b in batches) == 7
    assert client.history("t")[0].version == 1


@pytest.mark.slow
def test_cli_serve_and_graceful_shutdown(tmp_path: Path) -> None:
    port = free_port()
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flight_gateway.cli",
            "serve",
            "--catalog",
            f"sqlite:///{tmp_path / 'c.db'}",
            "--port",
            str(port),
            "--allow-anonymous",
        ],
        env={**os.environ, "PYTHONPATH": str(root)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        client = HarnessClient(f"grpc://127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create_table("t", SCHEMA)
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        assert client.list_tables() == ["t"]
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_cli_refuses_to_run_open_without_flag(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "flight_gateway.cli",
            "serve",
            "--catalog",
            f"sqlite:///{tmp_path / 'c.db'}",
            "--port",
            "0",
        ],
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--allow-anonymous" in out.stderr
