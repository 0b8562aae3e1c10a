"""TLS and mutual TLS with real certificates (made with the openssl command line)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from clients import HarnessClient
from flight_gateway.protocol.errors import Unauthenticated, Unauthorized, Unavailable
from tests.gateway.helpers import running_gateway
from tests.services import missing


def _cert(d: Path, name: str, cn: str, san: str) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={cn}",
    )
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    run(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        missing("the openssl command line (to make test certificates)")
    d = tmp_path_factory.mktemp("certs")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=harness-test-ca",
        ],
        check=True,
        capture_output=True,
        cwd=d,
    )
    _cert(d, "server", "127.0.0.1", "IP:127.0.0.1")
    _cert(d, "client", "spark-job", "DNS:spark-job")
    _cert(d, "stranger", "stranger", "DNS:stranger")
    return d


def _client(server: object, d: Path, who: str | None, token: str | None = None) -> HarnessClient:
    chain = (
        {
            "tls_cert_chain": (d / f"{who}.pem").read_bytes(),
            "tls_private_key": (d / f"{who}.key").read_bytes(),
        }
        if who
        else {}
    )
    return HarnessClient(
        f"grpc+tls://127.0.0.1:{server.port}",
        token=token,  # type: ignore[attr-defined]
        tls_root_certs=(d / "ca.pem").read_bytes(),
        **chain,
    )


def test_tls_serves_encrypted_and_reports_its_scheme(certs: Path, tmp_path: Path) -> None:
    tls = {"tls_cert": str(certs / "server.pem"), "tls_key": str(certs / "server.key")}
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", **tls) as (server, _):
        assert server.uri.startswith("grpc+tls://")
        with _client(server, certs, None) as c:
            c.create_table("t", [{"name": "id", "type": "int64"}])
            assert c.list_tables() == ["t"]


def test_mutual_tls_maps_the_certificate_to_a_principal(certs: Path, tmp_path: Path) -> None:
    config = {
        "tls_cert": str(certs / "server.pem"),
        "tls_key": str(certs / "server.key"),
        "tls_client_ca": str(certs / "ca.pem"),
        "certs": {"spark-job": {"name": "spark-job", "read": ["t"]}},
        "tokens": {"admin-token": {"name": "admin", "admin": ["*"]}},
        "allow_anonymous": False,
    }
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", **config) as (server, _):
        with _client(server, certs, "client", token="admin-token") as admin:
            admin.create_table("t", [{"name": "id", "type": "int64"}])
            admin.create_table("u", [{"name": "id", "type": "int64"}])
        with _client(server, certs, "client") as job:
            assert job.read("t").num_rows == 0  # the certificate's grants
            with pytest.raises(Unauthorized):
                job.read("u")
        with _client(server, certs, "stranger") as stranger, pytest.raises(Unauthenticated):
            stranger.list_tables()  # a valid certificate that maps to no principal
        with _client(server, certs, None) as no_cert, pytest.raises(Unavailable):
            no_cert.list_tables()  # the TLS handshake itself fails


def test_cli_reaches_a_private_ca_and_mutual_tls_gateway(
    certs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``harness-gateway`` with ``--tls-ca`` (or HARNESS_TLS_CA) trusts a private CA, and with
    ``--tls-cert``/``--tls-key`` (or their variables) presents a client certificate."""
    from flight_gateway.cli import main

    def cli(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    ca, cert, key = (str(certs / n) for n in ("ca.pem", "client.pem", "client.key"))
    tls = {"tls_cert": str(certs / "server.pem"), "tls_key": str(certs / "server.key")}
    with running_gateway(f"sqlite:///{tmp_path / 'a.db'}", **tls) as (server, _):
        uri = f"grpc+tls://127.0.0.1:{server.port}"
        with _client(server, certs, None) as c:
            c.create_table("t", [{"name": "id", "type": "int64"}])
        code, _, err = cli("tables", "--uri", uri)  # the system's roots do not know the CA
        assert code == 1 and err.startswith("harness-gateway tables:")
        assert cli("tables", "--uri", uri, "--tls-ca", ca) == (0, "t\n", "")
        monkeypatch.setenv("HARNESS_TLS_CA", ca)
        assert cli("tables", "--uri", uri) == (0, "t\n", "")
        code, _, err = cli("tables", "--uri", uri.replace("+tls", ""))  # TLS options, no TLS
        assert code == 1 and "need a grpc+tls://" in err
    mutual = {
        **tls,
        "tls_client_ca": ca,
        "certs": {"spark-job": {"name": "spark-job", "read": ["t"]}},
        "tokens": {"admin-token": {"name": "admin", "admin": ["*"]}},
        "allow_anonymous": False,
    }
    with running_gateway(f"sqlite:///{tmp_path / 'm.db'}", **mutual) as (server, _):
        uri = f"grpc+tls://127.0.0.1:{server.port}"
        with _client(server, certs, "client", token="admin-token") as admin:
            admin.create_table("t", [{"name": "id", "type": "int64"}])
        code, _, err = cli("tables", "--uri", uri)  # HARNESS_TLS_CA only: no certificate
        assert code == 1 and err.startswith("harness-gateway tables:")
        assert cli("tables", "--uri", uri, "--tls-cert", cert, "--tls-key", key) == (0, "t\n", "")
        monkeypatch.setenv("HARNESS_TLS_CERT", cert)
        monkeypatch.setenv("HARNESS_TLS_KEY", key)
        assert cli("tables", "--uri", uri) == (0, "t\n", "")  # the certificate's principal
        code, _, err = cli("tables", "--uri", uri, "--tls-key", str(certs / "missing.key"))
        assert code == 1 and "--tls-key: cannot read" in err
