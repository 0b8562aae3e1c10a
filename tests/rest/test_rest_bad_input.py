"""The Iceberg REST face under input found by probing it (2026-12-05): each case failed before
its fix (a 500 for a caller's number, a 400 for the gateway's own failure, a namespace that
contained itself, a token endpoint no client could parse, a slice written past the disk
budget before it was refused, a version served after it expired)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.gateway.helpers import client_for, running_gateway
from tests.rest.helpers import check_schema, get, pyiceberg_catalog

pytestmark = pytest.mark.integration
ADMIN = "admin-token-0123456789"
TOKENS = {ADMIN: {"name": "admin", "admin": ["*"]}}


def _gateway(tmp_path: Path, tokens: dict[str, Any] = TOKENS, **rest: Any) -> Any:
    return running_gateway(
        f"sqlite:///{tmp_path / 'c.db'}",
        tokens=tokens,
        allow_anonymous=False,
        reach={"any": True},
        iceberg_rest_port=0,
        iceberg_rest_dir=str(tmp_path / "rest"),
        iceberg_rest=rest,
    )


def _table(client: Any, root: Path, name: str = "t", fmt: str = "parquet", rows: int = 2) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    data = pa.table(
        {"id": pa.array(range(rows), pa.int64()), "name": [f"n{i}" for i in range(rows)]}
    )
    if fmt == "csv":
        path = root / "f.csv"
        path.write_text("id,name\n" + "".join(f"{i},n{i}\n" for i in range(rows)))
    else:
        path = root / "f.parquet"
        pq.write_table(data, path)
    client.create_table(name, [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}])
    config = {"root": str(root), **({"format": "csv"} if fmt == "csv" else {})}
    client.add_source(name, "f", "files", config=config, state={"files": [path.name]})
    return path


def test_numbers_namespaces_and_failures_get_fitting_statuses(tmp_path: Path) -> None:
    with _gateway(tmp_path) as (server, _):
        admin = client_for(server, ADMIN)
        path = _table(admin, tmp_path / "f")
        base = f"http://127.0.0.1:{server.rest.port}/v1"
        table = f"{base}/namespaces/harness/tables/t"
        for version in (2**63, 10**30):  # was 500, OverflowError
            status, body = get(f"{table}?version={version}", ADMIN)
            assert status == 400, body
            check_schema("ErrorModel", body["error"])
        # the one namespace holds no other (a client walking the tree stops), an unknown
        # parent is no namespace
        assert get(f"{base}/namespaces?parent=harness", ADMIN) == (200, {"namespaces": []})
        status, body = get(f"{base}/namespaces?parent=nope", ADMIN)
        assert status == 404 and body["error"]["type"] == "NoSuchNamespaceException"
        catalog = pyiceberg_catalog(f"http://127.0.0.1:{server.rest.port}", ADMIN)
        assert catalog.list_namespaces() == [("harness",)]
        assert catalog.list_namespaces("harness") == []
        # a file of the pinned state removed: the gateway's trouble, not the caller's (was 500)
        path.unlink()
        status, body = get(table, ADMIN)
        assert status == 503, body
        assert body["error"]["type"] == "ServiceUnavailableException"
        admin.close()


def test_a_client_asking_for_a_token_gets_an_oauth_error_it_can_read(tmp_path: Path) -> None:
    with _gateway(tmp_path) as (server, _):
        uri = f"http://127.0.0.1:{server.rest.port}"
        req = urllib.request.Request(
            f"{uri}/v1/oauth/tokens",
            data=b"grant_type=client_credentials&client_id=c&client_secret=SECRETPW",
            method="POST",
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=30)
        body = json.loads(info.value.read())
        assert info.value.code == 400
        check_schema("OAuthError", body)
        from pyiceberg.catalog.rest import RestCatalog

        with pytest.raises(Exception, match="issues no tokens") as raised:
            RestCatalog("h", uri=uri, credential="client:SECRETPW")
        assert "SECRETPW" not in str(raised.value)


def test_a_slice_past_the_budget_is_refused_before_it_fills_the_disk(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A 1 MB budget and a CSV source of ~20 MB (sliced): refused as soon as the slice being
    written passes the budget (the largest size it was checked at is the budget and a row
    group, not the whole slice), with a message saying it cannot fit; nothing is left."""
    with _gateway(tmp_path, disk_budget_mb=1) as (server, _):
        admin = client_for(server, ADMIN)
        _table(admin, tmp_path / "f", fmt="csv", rows=1_500_000)
        store = server.rest.rest.store
        checked: list[int] = []
        check = store.check_budget

        def recorded(adding: int, *args: Any) -> None:
            checked.append(adding)
            check(adding, *args)

        monkeypatch.setattr(store, "check_budget", recorded)
        status, body = get(f"http://127.0.0.1:{server.rest.port}/v1/namespaces/harness/tables/t",
                           ADMIN)  # fmt: skip
        assert status == 503, body
        assert "does not fit" in body["error"]["message"]
        assert 0 < max(checked) < 4 << 20, checked  # the whole slice is ~17 MB
        left = sum(p.stat().st_size for p in (tmp_path / "rest").rglob("*.parquet"))
        assert left == 0, left
        admin.close()


def test_a_version_expired_while_it_loads_is_not_served(tmp_path: Path, monkeypatch: Any) -> None:
    """The version is expired between its pin and the metadata's answer (the window of a
    slow layout): NOT_FOUND, as a drop in that window already was."""
    with _gateway(tmp_path) as (server, _):
        admin = client_for(server, ADMIN)
        _table(admin, tmp_path / "f")
        catalog = server.rest.rest
        layout = catalog._layout

        churn = [True]  # commits to make, each expiring the version being loaded

        def slow_layout(snap: Any, who: Any) -> Any:
            out = layout(snap, who)
            if churn:
                churn.pop()
                admin.commit("t", properties={"touched": True})
                admin.expire_versions("t", keep_last=1)
            return out

        monkeypatch.setattr(catalog, "_layout", slow_layout)
        url = f"http://127.0.0.1:{server.rest.port}/v1/namespaces/harness/tables/t"
        status, body = get(f"{url}?version=1", ADMIN)
        assert status == 404, body
        assert "expired" in body["error"]["message"]
        # The latest version, expired the same way while it loads: the new latest is loaded
        # (a table that exists is never 404 to Spark or Trino).
        latest = admin.describe("t").version
        churn.append(True)
        status, body = get(url, ADMIN)
        assert status == 200, body
        assert body["metadata"]["current-snapshot-id"] & 0xFFFFFFFF == latest + 1
        admin.close()


def test_a_source_pointing_back_at_the_face_ends_and_others_are_answered(
    tmp_path: Path,
) -> None:
    """A table admin adds to table ``x`` an Iceberg source read through this face's own
    ``harness.x``: each load of ``x`` loads ``x`` again, a thread each. It hung the face for
    everyone; now the loop ends when the principal has ``max_requests_per_principal`` loads
    in progress (503), and another caller's requests are answered meanwhile."""
    import threading
    import time

    reader = "reader-token-0123456789"
    tokens = {**TOKENS, reader: {"name": "reader", "read": ["t"]}}
    with _gateway(tmp_path, tokens) as (server, _):
        admin = client_for(server, ADMIN)
        _table(admin, tmp_path / "f", name="x")
        base = f"http://127.0.0.1:{server.rest.port}"
        status, body = get(f"{base}/v1/namespaces/harness/tables/x", ADMIN)
        assert status == 200, body
        snapshot = body["metadata"]["current-snapshot-id"]
        catalog = {"type": "rest", "uri": base, "token": ADMIN}
        admin.add_source("x", "self", "iceberg", config={"catalog": catalog,
                         "identifier": "harness.x"}, state={"snapshot_id": snapshot})  # fmt: skip
        answers: list[tuple[int, Any]] = []
        loop = threading.Thread(
            target=lambda: answers.append(get(f"{base}/v1/namespaces/harness/tables/x", ADMIN))
        )
        started = time.monotonic()
        loop.start()
        time.sleep(0.5)
        assert get(f"{base}/v1/config", reader)[0] == 200  # answered while the loop runs
        loop.join(120)
        assert not loop.is_alive(), "the load of x never ended"
        status, body = answers[0]
        assert status in (400, 503), body
        assert time.monotonic() - started < 60
        status, _ = get(f"{base}/v1/namespaces/harness/tables/t", reader)
        assert status == 404  # the face still answers (t does not exist here)
        admin.close()


def _call(
    url: str, method: str, token: str = ADMIN, data: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, Any]:  # fmt: skip
    """(status, JSON body or None, headers) of one request; error statuses returned."""
    sent = {"Authorization": f"Bearer {token}", **(headers or {})}
    req = urllib.request.Request(url, data=data, headers=sent, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None, resp.headers
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None, e.headers


def test_a_method_a_route_does_not_have_is_405_with_allow(tmp_path: Path) -> None:
    """OPTIONS, PATCH, TRACE, a made-up method, or one the spec does not give the route
    (DELETE of /v1/config) was 405 labelled ForbiddenException (Tornado's own 405s
    BadRequestException), without ``Allow``; now 405 MethodNotAllowedException in the error
    model, with ``Allow: GET, HEAD``. The spec's writes stay 403 (read-only)."""
    with _gateway(tmp_path) as (server, _):
        base = f"http://127.0.0.1:{server.rest.port}/v1"
        table = f"{base}/namespaces/harness/tables/t"
        for method, url in [("OPTIONS", f"{base}/config"), ("PATCH", table),
                            ("TRACE", f"{base}/namespaces"), ("FROB", table),
                            ("DELETE", f"{base}/config"), ("PUT", table)]:  # fmt: skip
            status, body, headers = _call(url, method)
            assert status == 405, (method, url, status, body)
            check_schema("IcebergErrorResponse", body)
            assert body["error"]["type"] == "MethodNotAllowedException", body
            assert method in body["error"]["message"]
            assert headers["Allow"] == "GET, HEAD", (method, dict(headers))
        status, body, _ = _call(f"{base}/namespaces/harness/tables", "POST", data=b"{}")
        assert status == 403 and body["error"]["type"] == "ForbiddenException"
        status, body, _ = _call(f"{base}/tables/rename", "POST", data=b"{}")
        assert status == 403 and "read-only" in body["error"]["message"]


def test_a_body_or_headers_past_the_limit_get_the_error_model(tmp_path: Path) -> None:
    """A body past 64 KB, or headers past 64 KB, got Tornado's bare 400 (no JSON) or a closed
    connection; now 413 for the body (announced by Content-Length, or sent chunked) and 431 for
    headers, each in the spec's error model. The face still answers afterwards."""
    import http.client
    import socket

    with _gateway(tmp_path) as (server, _):
        port = server.rest.port
        url = f"http://127.0.0.1:{port}/v1/namespaces/harness/tables"
        status, body, _ = _call(url, "POST", data=b"x" * (65 * 1024))
        assert status == 413, (status, body)
        check_schema("IcebergErrorResponse", body)
        assert "64 KB" in body["error"]["message"]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        chunks = iter([b"y" * 8192] * 10)  # 80 KB, no Content-Length
        conn.request("POST", "/v1/namespaces/harness/tables", body=chunks,
                     headers={"Authorization": f"Bearer {ADMIN}"}, encode_chunked=True)  # fmt: skip
        resp = conn.getresponse()
        raw = resp.read()
        assert resp.status == 413, (resp.status, raw)
        check_schema("IcebergErrorResponse", json.loads(raw))
        conn.close()
        # Past DRAIN_BYTES (1 MB) the 413 goes at once and the connection closes: a client
        # still sending may see the reset, never a 2xx or a hang.
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            head = (f"POST /v1/namespaces/harness/tables HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {ADMIN}\r\nTransfer-Encoding: chunked\r\n\r\n")  # fmt: skip
            try:
                sock.sendall(head.encode() + (b"10000\r\n" + b"y" * 65536 + b"\r\n") * 17)
                resp = http.client.HTTPResponse(sock)
                resp.begin()
                assert resp.status == 413, (resp.status, resp.read())
            except (BrokenPipeError, ConnectionResetError):
                pass  # the answer lost to the reset of a connection closed mid-body
        status, body, _ = _call(f"http://127.0.0.1:{port}/v1/config", "GET",
                                headers={"X-Big": "z" * (70 * 1024)})  # fmt: skip
        assert status == 431, (status, body)
        check_schema("IcebergErrorResponse", body)
        assert get(f"http://127.0.0.1:{port}/v1/config", ADMIN)[0] == 200


def test_metadata_files_count_against_the_disk_budget(tmp_path: Path) -> None:
    """A table read in place writes no slice, only metadata (a manifest, a manifest list, the
    table metadata), which the budget did not count: a load past the budget answered 200
    with the store over it. Now metadata is checked as slices are (after a sweep): 503
    SlowDownException naming the setting, no file left past the budget; within it, 200."""
    with _gateway(tmp_path) as (server, _):
        admin = client_for(server, ADMIN)
        _table(admin, tmp_path / "f")
        store = server.rest.rest.store
        store.budget_bytes = 2048  # below any config's (whole MB): a load's metadata passes it
        url = f"http://127.0.0.1:{server.rest.port}/v1/namespaces/harness/tables/t"
        status, body = get(url, ADMIN)
        assert status == 503, body
        assert body["error"]["type"] == "SlowDownException", body
        assert "disk_budget_mb" in body["error"]["message"]
        assert store.used_bytes() <= store.budget_bytes
        files = [p for p in (tmp_path / "rest").rglob("t*/metadata/*") if p.is_file()]
        assert sum(p.stat().st_size for p in files) <= store.budget_bytes, files
        assert not [p for p in files if p.name.startswith(".tmp-")]
        store.budget_bytes = 1 << 20
        status, body = get(url, ADMIN)
        assert status == 200, body
        assert 0 < store.used_bytes() <= store.budget_bytes
        admin.close()
