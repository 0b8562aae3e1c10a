"""The Iceberg REST face as guarded as Flight (Security III, findings 3-7): TLS and mutual TLS
with the gateway's certificates, a client certificate as a principal; scrubbed errors; bounded
disk, loads and connections; half-sent requests closed; private file modes. Each test failed on
the face that copied versions into ``http.server``."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import stat
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.gateway.helpers import client_for, running_gateway
from tests.rest.helpers import get
from tests.security.test_tls import _client as _tls_client
from tests.security.test_tls import certs  # noqa: F401 - the module's certificates fixture

ADMIN = "admin-token-0123456789"
TOKENS = {ADMIN: {"name": "admin", "admin": ["*"]}}


def _files_table(client: Any, root: Path, name: str, ids: list[int]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids}), root / "f.parquet")
    client.create_table(name, [{"name": "id", "type": "int64"}])
    client.add_source(name, "f", "files", config={"root": str(root)},
                      state={"files": ["f.parquet"]})  # fmt: skip


# ---------------------------------------------------------------- 5. TLS and mutual TLS


def test_rest_speaks_the_gateways_tls_and_takes_client_certificates(
    tmp_path: Path,
    certs: Path,  # noqa: F811
    monkeypatch: Any,
) -> None:
    # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override pyiceberg's ``ssl.cabundle``
    # (psf/requests#3829); docs/engines.md tells users the same.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    config = {
        "tokens": TOKENS,
        "certs": {"spark-job": {"name": "spark-etl", "read": ["t"]}},
        "tls_cert": str(certs / "server.pem"),
        "tls_key": str(certs / "server.key"),
        "tls_client_ca": str(certs / "ca.pem"),
        "reach": {"any": True},
        "allow_anonymous": False,
        "iceberg_rest_port": 0,
    }
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", **config) as (server, _):
        admin = _tls_client(server, certs, "client", ADMIN)
        _files_table(admin, tmp_path / "f", "t", [1, 2])
        _files_table(admin, tmp_path / "g", "secret", [3])
        port = server.rest.port
        # Plain HTTP: no answer a client could take for the catalog's.
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/config", timeout=10).read()
        # HTTPS without a client certificate: the handshake fails.
        bare = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"https://127.0.0.1:{port}/v1/config", context=bare,
                                   timeout=10).read()  # fmt: skip
        # With one: the certificate's principal, and only its tables.
        mutual = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        mutual.load_cert_chain(str(certs / "client.pem"), str(certs / "client.key"))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/v1/namespaces/harness/tables",
                                    context=mutual, timeout=30) as resp:  # fmt: skip
            names = [i["name"] for i in json.loads(resp.read())["identifiers"]]
        assert names == ["t"]
        # pyiceberg over mutual TLS reads the table.
        from pyiceberg.catalog.rest import RestCatalog

        catalog = RestCatalog("harness", uri=f"https://127.0.0.1:{port}", **{  # no token
            "ssl": {"cabundle": str(certs / "ca.pem"),
                    "client": {"cert": str(certs / "client.pem"), "key": str(certs / "client.key")}},
        })  # fmt: skip
        ids = catalog.load_table("harness.t").scan().to_arrow().column("id").to_pylist()
        assert sorted(ids) == [1, 2]
        admin.close()


# ---------------------------------------------------------------- 4. scrubbed errors


def test_rest_errors_carry_no_secret(tmp_path: Path, pg_dsn: str, monkeypatch: Any) -> None:
    """A source whose connection fails with its DSN in the message: the REST caller gets the
    error without the password, whether it was a ``${HARNESS_SECRET_*}`` or literal."""
    from urllib.parse import urlsplit

    u = urlsplit(pg_dsn)
    monkeypatch.setenv("HARNESS_SECRET_LAKE_PW", "Resolved-Pw-5521")
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", reach={"any": True},
                         iceberg_rest_port=0) as (server, _):  # fmt: skip
        client = client_for(server)
        client.create_table("lake", [{"name": "id", "type": "int64"}])
        for i, password in enumerate(("${HARNESS_SECRET_LAKE_PW}", "Literal-Pw-8431")):
            metadata = (f"postgres:dbname=no_such_lake_db host={u.hostname} port={u.port} "
                        f"user=postgres password={password}")  # fmt: skip
            config = {"metadata": metadata, "data_path": str(tmp_path / "lake"), "table": "t"}
            with contextlib.suppress(Exception):  # refused at commit: the REST load still fails
                client.add_source("lake", f"l{i}", "ducklake", state={"snapshot_id": 1},
                                  config=config)  # fmt: skip
        status, body = get(f"http://127.0.0.1:{server.rest.port}/v1/namespaces/harness/tables/lake")
        assert status >= 400, body
        text = json.dumps(body)
        assert "Resolved-Pw-5521" not in text and "Literal-Pw-8431" not in text
        client.close()


# ---------------------------------------------------------------- 3. disk and loads bounded


def test_a_load_past_the_disk_budget_fails_cleanly(tmp_path: Path, kafka_bootstrap: str) -> None:
    from tests.gateway.kafka_helpers import new_topic, produce

    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, [json.dumps({"id": i, "pad": os.urandom(450).hex()}).encode()
                                     for i in range(3000)])  # fmt: skip
    rest_dir = tmp_path / "rest"
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", reach={"any": True},
                         iceberg_rest_port=0, iceberg_rest_dir=str(rest_dir),
                         iceberg_rest={"disk_budget_mb": 1}) as (server, _):  # fmt: skip
        client = client_for(server)
        client.create_table("t", [{"name": "id", "type": "int64"}, {"name": "pad", "type": "string"}])  # fmt: skip
        kafka = {"bootstrap_servers": kafka_bootstrap, "topic": topic, "partition": 0}
        client.add_source("t", "k", "kafka", config=kafka, state={"low": 0, "high": 3000})
        url = f"http://127.0.0.1:{server.rest.port}/v1/namespaces/harness/tables/t"
        for _ in range(2):  # a retry fails the same way, and leaves nothing either
            status, body = get(url)
            assert status == 503 and "disk_budget_mb" in body["error"]["message"], body
            assert not list(rest_dir.rglob("*.parquet"))
            assert not list(rest_dir.rglob(".tmp-*"))
        # Within budget (one message), loads work again.
        client.commit("t", updates=[{"source": "k", "state": {"low": 0, "high": 1}}])
        assert get(url)[0] == 200
        client.close()


def test_loads_that_make_slices_are_bounded_per_principal(tmp_path: Path) -> None:
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", reach={"any": True},
                         iceberg_rest_port=0,
                         iceberg_rest={"max_loads_per_principal": 1}) as (server, _):  # fmt: skip
        client = client_for(server)
        root = tmp_path / "csv"
        root.mkdir()
        (root / "a.csv").write_text("id\n1\n2\n")
        client.create_table("t", [{"name": "id", "type": "int64"}])
        client.add_source("t", "c", "files", config={"root": str(root), "format": "csv"},
                          state={"files": ["a.csv"]})  # fmt: skip
        slots = server.rest.rest.loads
        with slots.hold("anonymous"):  # another load of this principal is making slices
            status, body = get(
                f"http://127.0.0.1:{server.rest.port}/v1/namespaces/harness/tables/t"
            )
            assert status == 503 and "max_loads_per_principal" in body["error"]["message"]
        assert get(f"http://127.0.0.1:{server.rest.port}/v1/namespaces/harness/tables/t")[0] == 200
        client.close()


# ---------------------------------------------------------------- 6. half-sent requests


def test_half_sent_requests_are_closed_and_others_answered(tmp_path: Path) -> None:
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", iceberg_rest_port=0,
                         iceberg_rest={"header_timeout_s": 2, "max_connections": 100}) as (server, _):  # fmt: skip
        port = server.rest.port
        slow = []
        for _ in range(300):  # past max_connections: the rest are closed as they arrive
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            with contextlib.suppress(OSError):
                s.sendall(b"GET /v1/config HTTP/1.1\r\nHost: x\r\n")  # headers never end
            slow.append(s)
        # Once the half-sent ones are closed (header deadline), a real request is answered.
        deadline = time.monotonic() + 30
        open_left = len(slow)
        while open_left and time.monotonic() < deadline:
            open_left = sum(1 for s in slow if _still_open(s))
            time.sleep(0.2)
        assert open_left == 0, f"{open_left} half-sent connections still open"
        assert get(f"http://127.0.0.1:{port}/v1/config")[0] == 200
        for s in slow:
            s.close()


def _still_open(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


# ---------------------------------------------------------------- 7. private files


def test_the_slice_store_is_private(tmp_path: Path) -> None:
    rest_dir = tmp_path / "rest"
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", reach={"any": True},
                         iceberg_rest_port=0, iceberg_rest_dir=str(rest_dir)) as (server, _):  # fmt: skip
        client = client_for(server)
        root = tmp_path / "csv"
        root.mkdir()
        (root / "a.csv").write_text("id\n1\n")
        client.create_table("t", [{"name": "id", "type": "int64"}])
        client.add_source("t", "c", "files", config={"root": str(root), "format": "csv"},
                          state={"files": ["a.csv"]})  # fmt: skip
        assert get(f"http://127.0.0.1:{server.rest.port}/v1/namespaces/harness/tables/t")[0] == 200
        made = [p for p in rest_dir.rglob("*") if not p.name.startswith("index.db-")]
        assert any(p.suffix == ".parquet" for p in made)
        for p in [rest_dir, *made]:
            mode = stat.S_IMODE(os.stat(p).st_mode)
            assert mode & 0o077 == 0, f"{p} is {oct(mode)}"
        client.close()
