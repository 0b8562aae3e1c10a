"""The ``harness-gateway`` command line against a running gateway: every client sub-command,
declarative ``apply`` round trips, and a progress bar only on a terminal."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clients import HarnessClient
from flight_gateway.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], uri: str, *argv: str) -> tuple[int, str, str]:
    code = main([argv[0], "--uri", uri, *argv[1:]])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], uri: str, *argv: str) -> Any:
    code, out, err = run(capsys, uri, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


DECLARED = """
tables:
  - name: events
    schema:
      - {name: id, type: int64}
      - {name: level, type: string}
    properties: {retention.keep_last: 10}
    sources:
      - name: cold
        kind: files
        config: {root: "ROOT", format: parquet}
        state: {files: [a.parquet]}
"""


@pytest.fixture
def declared(tmp_path: Path) -> Path:
    pq.write_table(
        pa.table({"id": [1, 2, 3], "level": ["info", "error", "info"]}), tmp_path / "a.parquet"
    )
    pq.write_table(pa.table({"id": [4], "level": ["error"]}), tmp_path / "b.parquet")
    f = tmp_path / "tables.yaml"
    f.write_text(DECLARED.replace("ROOT", str(tmp_path)))
    return f


def test_apply_round_trip(
    capsys: pytest.CaptureFixture[str], client: HarnessClient, declared: Path
) -> None:
    uri = client.uri
    dry = run_json(capsys, uri, "apply", str(declared), "--dry-run")
    assert "+ create table events" in dry["plan"] and dry["versions"] == {}
    assert "events" not in client.list_tables()

    first = run_json(capsys, uri, "apply", str(declared))
    assert first["plan"] == ["+ create table events", "+ events: source cold (files)"]
    version = client.describe("events").version

    again = run_json(capsys, uri, "apply", str(declared))  # nothing changed: nothing committed
    assert again == {"plan": [], "versions": {}}
    assert client.describe("events").version == version

    text = declared.read_text().replace("retention.keep_last: 10", "retention.keep_last: 5")
    declared.write_text(text)
    edited = run_json(capsys, uri, "apply", str(declared))
    assert edited["plan"] == ["~ events: property retention.keep_last = 5"]
    assert client.describe("events").version == version + 1
    assert client.describe("events").properties["retention.keep_last"] == 5

    # Removing the only source is destructive: refused, nothing committed.
    declared.write_text(text.split("    sources:")[0])
    code, _, err = run(capsys, uri, "apply", str(declared))
    assert code == 1 and "destructive changes refused" in err and "remove source cold" in err
    assert client.describe("events").version == version + 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tables:\n  - name: t\n", ":2:5: tables.t: missing ['schema']"),
        (
            "tables:\n  - name: t\n    schema:\n      - {name: id, type: int64, colour: red}\n",
            ":4:41: tables.t.schema[0].colour: unknown key",
        ),
        (
            "tables:\n  - name: t\n    schema: []\n    sources:\n      - {name: s}\n",
            ":5:9: tables.t.sources[0]: missing ['kind']",
        ),
        ("tables: [\n", "not valid YAML"),
    ],
)
def test_apply_bad_file_names_line_and_field(
    capsys: pytest.CaptureFixture[str],
    client: HarnessClient,
    tmp_path: Path,
    text: str,
    message: str,
) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    code, out, err = run(capsys, client.uri, "apply", str(f))
    assert code == 1 and message in err and not out
    assert client.list_tables() == []


THREE_ERRORS = """\
tables:
  - name: events
    schema:
      - {name: id, type: int65}
      - {name: p, type: int32}
    partition_by: [p, q]
    sources:
      - name: cold
        kind: files
        config: {root: /tmp}
      - name: hot
        kind: kafkaa
"""


def test_apply_reports_every_error_with_line_and_key_path_and_applies_nothing(
    capsys: pytest.CaptureFixture[str], client: HarnessClient, tmp_path: Path
) -> None:
    f = tmp_path / "three.yaml"
    f.write_text(THREE_ERRORS)
    code, out, err = run(capsys, client.uri, "apply", str(f))
    assert code == 1 and not out
    assert "3 error(s)" in err and "nothing applied" in err
    assert f"{f}:4:26: tables.events.schema[0].type: not a column type" in err
    assert f"{f}:6:19: tables.events.partition_by: 'q' is not a column of the table" in err
    assert f"{f}:12:15: tables.events.sources[1].kind: unknown source kind 'kafkaa'" in err
    assert client.list_tables() == []


def test_every_client_command(
    capsys: pytest.CaptureFixture[str], client: HarnessClient, declared: Path, tmp_path: Path
) -> None:
    uri = client.uri
    run_json(capsys, uri, "apply", str(declared))
    assert run_json(capsys, uri, "tables") == ["events"]
    info = run_json(capsys, uri, "describe", "events")
    assert [s["name"] for s in info["sources"]] == ["cold"]

    body = tmp_path / "commit.json"
    body.write_text(
        json.dumps(
            {"updates": [{"source": "cold", "state": {"files": ["a.parquet", "b.parquet"]}}]}
        )
    )
    committed = run_json(capsys, uri, "commit", str(body), "events")
    assert committed["applied"] is True
    assert run_json(capsys, uri, "describe", "events", "--version", "1")["version"] == 1
    history = run_json(capsys, uri, "history", "events")
    assert [h["version"] for h in history] == [committed["version"], 1, 0]

    code, out, _ = run(
        capsys, uri, "read", "events", "--format", "csv", "--filter", "level = 'error'"
    )
    assert code == 0 and out.splitlines()[0] == '"id","level"'
    assert sorted(out.splitlines()[1:]) == ['2,"error"', '4,"error"']
    code, out, _ = run(capsys, uri, "read", "events", "--format", "json", "--version", "1")
    assert sorted(json.loads(line)["id"] for line in out.splitlines()) == [1, 2, 3]
    code, out, _ = run(capsys, uri, "read", "events", "--columns", "level", "--limit", "2")
    assert out.splitlines()[0].strip() == "level" and len(out.splitlines()) == 3
    target = tmp_path / "out.parquet"
    assert (
        run(capsys, uri, "read", "events", "--format", "parquet", "--output", str(target))[0] == 0
    )
    assert pq.read_table(target).num_rows == 4

    code, out, _ = run(
        capsys,
        uri,
        "sql",
        "SELECT level, count(*) AS n FROM events GROUP BY level ORDER BY level",
        "--format",
        "csv",
    )
    assert code == 0 and out.splitlines() == ['"level","n"', '"error",2', '"info",2']

    grant = run_json(capsys, uri, "lock", "events", "cold", "--owner", "tester", "--ttl", "30")
    held = run_json(capsys, uri, "locks", "events")
    assert held[0]["owner"].endswith(":tester") and held[0]["sources"] == ["cold"]
    assert held[0]["lock_id"] == grant["lock_id"]  # its own principal sees the id
    code, _, err = run(capsys, uri, "commit", str(body), "events")
    assert code == 1 and "locked by" in err
    run_json(capsys, uri, "unlock", grant["lock_id"])
    assert run_json(capsys, uri, "locks", "events") == []

    assert run_json(capsys, uri, "expire", "events", "--keep-last", "1")["expired"] >= 2
    code, _, err = run(capsys, uri, "describe", "events", "--version", "1")
    assert code == 1 and "expired" in err
    code, _, err = run(capsys, uri, "read", "nope")
    assert code == 1 and "NotFound" in err


def _cli(uri: str, *argv: str, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_URI": uri}
    return subprocess.run(
        [sys.executable, "-m", "flight_gateway.cli", *argv], env=env, timeout=120, **kw
    )


def test_progress_only_on_a_terminal(client: HarnessClient, declared: Path) -> None:
    main(["apply", "--uri", client.uri, str(declared)])
    # Not a terminal: stdout holds exactly the CSV, stderr nothing.
    piped = _cli(client.uri, "read", "events", "--format", "csv", capture_output=True)
    assert piped.returncode == 0 and piped.stderr == b""
    assert piped.stdout.decode().splitlines()[0] == '"id","level"'
    # A terminal on stderr: the progress line goes there, stdout is still only the CSV.
    leader, follower = pty.openpty()
    tty = _cli(
        client.uri, "read", "events", "--format", "csv", stdout=subprocess.PIPE, stderr=follower
    )
    os.close(follower)
    drawn = io.BytesIO()
    try:
        while chunk := os.read(leader, 4096):
            drawn.write(chunk)
    except OSError:  # the pty closes when the child exits
        pass
    os.close(leader)
    assert tty.returncode == 0 and tty.stdout == piped.stdout
    assert b"3 rows" in drawn.getvalue() and b"1/1 endpoints" in drawn.getvalue()


_SERVE_PARSE = """
import json, sys
from flight_gateway.cli import parser_for
argv = ["--log-level", "INFO", "serve", "--catalog", "sqlite:///x.db", "--port", "1"]
args = parser_for(argv).parse_args(argv)
print(json.dumps([args.command, sorted(m for m in sys.modules if m.startswith("planners."))]))
"""


def test_serve_loads_no_source_kind_for_the_command_line() -> None:
    """``serve`` parses its command line without the kinds' sub-commands: adding them loaded
    every kind's module (~0.5 s of each start's CPU); the kinds a catalog uses load when it
    needs them. A kind's own sub-command still parses."""
    out = subprocess.run([sys.executable, "-c", _SERVE_PARSE], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)  # fmt: skip
    command, modules = json.loads(out.stdout.splitlines()[-1])
    assert command == "serve"
    kinds = ["planners.delta", "planners.files", "planners.iceberg", "planners.postgres",
             "planners.paimon", "planners.hudi", "planners.ducklake", "planners.flight"]  # fmt: skip
    assert [m for m in modules if m in kinds] == []
    with pytest.raises(SystemExit) as usage:
        main(["postgres", "enable-versioning", "--help"])
    assert usage.value.code == 0
