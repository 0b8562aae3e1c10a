"""One test per finding of the security review (issue 10): each failed before its fix."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from clients import HarnessClient
from flight_gateway.app import GatewayConfig
from flight_gateway.protocol.errors import (
    InvalidArgument,
    LockExpired,
    ResourceExhausted,
    Unauthenticated,
    Unauthorized,
)
from tests.gateway.helpers import client_for, running_gateway, write_parquet

SCHEMA = [{"name": "id", "type": "int64"}, {"name": "v", "type": "string"}]
TOKENS = {
    "admin-token": {"name": "admin", "admin": ["*"]},
    "writer-token": {"name": "writer", "write": ["t*"]},
    "writer2-token": {"name": "writer2", "write": ["t*"]},
    "reader-token": {"name": "reader", "read": ["t*"]},
    "nothing-token": {"name": "nobody"},
}


@contextlib.contextmanager
def secure(tmp_path: Path, **config: object) -> Iterator[dict[str, HarnessClient]]:
    """A gateway with tokens and an allow-list reaching only ``tmp_path/data``."""
    (tmp_path / "data").mkdir(parents=True, exist_ok=True)
    config.setdefault("tokens", TOKENS)
    config.setdefault("reach", {"paths": [str(tmp_path / "data")]})
    config.setdefault("allow_anonymous", False)
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", **config) as (server, _):
        clients = {t.split("-")[0]: client_for(server, token=t, busy_wait_s=0) for t in TOKENS}
        clients["anonymous"] = client_for(server, busy_wait_s=0)
        clients["server"] = server  # type: ignore[assignment]
        try:
            yield clients
        finally:
            for name, c in clients.items():
                if name != "server":
                    c.close()


def files_table(c: dict[str, HarnessClient], tmp_path: Path) -> None:
    write_parquet(tmp_path / "data" / "a.parquet", pa.table({"id": [1, 2], "v": ["x", "y"]}))
    c["admin"].create_table("t", SCHEMA)
    c["admin"].add_source(
        "t", "f", "files", config={"root": str(tmp_path / "data")}, state={"files": ["a.parquet"]}
    )


# ---------------------------------------------------------------- tokens and permissions


def test_token_keys_in_the_config_file_are_substituted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WRITER_TOKEN", "the-real-writer-token")
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps({"tokens": {"${WRITER_TOKEN}": {"name": "w", "admin": ["*"]}}}))
    config = GatewayConfig.load(str(path), port=0, ticket_key="k" * 32)
    assert list(config.tokens) == ["the-real-writer-token"]
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with running_gateway(url, tokens=config.tokens, allow_anonymous=False) as (server, _):
        with client_for(server, token="the-real-writer-token") as real:
            real.create_table("t", SCHEMA)
        with client_for(server, token="${WRITER_TOKEN}") as literal, pytest.raises(Unauthenticated):
            literal.list_tables()


def test_unresolved_token_or_ticket_key_stops_the_gateway(tmp_path: Path) -> None:
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps({"tokens": {"${NOT_SET_ANYWHERE}": {}}}))
    with pytest.raises(ValueError, match="NOT_SET_ANYWHERE"):
        GatewayConfig.load(str(path))
    with pytest.raises(ValueError, match="unresolved"):
        GatewayConfig(tokens={"${X}": {}})
    with pytest.raises(ValueError, match="unresolved"):
        GatewayConfig(ticket_key="${HARNESS_TICKET_KEY}")


def test_anonymous_gets_nothing_when_tokens_are_configured(tmp_path: Path) -> None:
    with secure(tmp_path, allow_anonymous=True) as c:
        files_table(c, tmp_path)
        with pytest.raises(Unauthorized):
            c["anonymous"].read("t")
        with pytest.raises(Unauthorized):
            c["anonymous"].create_table("t2", SCHEMA)
        assert c["anonymous"].list_tables() == []
    with secure(tmp_path, allow_anonymous=True, anonymous={"read": ["t"]}) as c:
        assert c["anonymous"].read("t").num_rows == 2  # only what the config grants
        with pytest.raises(Unauthorized):
            c["anonymous"].put("t", pa.table({"id": [3], "v": ["z"]}))


def test_a_token_spec_grants_only_what_it_lists(tmp_path: Path) -> None:
    with secure(tmp_path) as c:
        files_table(c, tmp_path)
        with pytest.raises(Unauthorized):
            c["nothing"].read("t")
        assert c["nothing"].list_tables() == []
        assert c["reader"].read("t").num_rows == 2


def test_permission_levels(tmp_path: Path) -> None:
    with secure(tmp_path) as c:
        files_table(c, tmp_path)
        writer, reader = c["writer"], c["reader"]
        with pytest.raises(Unauthorized, match="may not admin"):
            writer.create_table("t2", SCHEMA)
        with pytest.raises(Unauthorized, match="may not admin"):
            writer.add_source("t", "g", "files", config={"root": str(tmp_path / "data")})
        with pytest.raises(Unauthorized, match="may not admin"):
            writer.evolve_schema("t", [{"op": "add_column", "name": "x", "type": "int64"}])
        with pytest.raises(Unauthorized, match="may not admin"):
            writer.action("harness.expire_versions", {"table": "t", "keep_last": 1})
        with pytest.raises(Unauthorized, match="may not admin"):
            writer.commit("t", properties={"dedupe.order_by": "id"})
        with pytest.raises(Unauthorized, match="may not write"):
            reader.commit("t", updates=[{"source": "f", "state": {"files": []}}])
        # A writer commits states of existing sources.
        writer.commit("t", updates=[{"source": "f", "state": {"files": ["a.parquet"]}}])


def test_tickets_are_bound_to_the_caller(tmp_path: Path) -> None:
    with secure(tmp_path) as c:
        files_table(c, tmp_path)
        info = c["writer"].flight_info("t")
        with pytest.raises(Unauthorized, match="issued to another principal"):
            c["reader"].read_endpoint(info.endpoints[0]).read_all()
        assert c["writer"].read_endpoint(info.endpoints[0]).read_all().num_rows == 2


# ---------------------------------------------------------------- what sources may reach


def test_a_writer_cannot_read_the_gateways_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_ONLY_VALUE", "do-not-leak-this-1")
    monkeypatch.setenv("HARNESS_SECRET_ROOT", "/no/such/dir/secret-root-value")
    with secure(tmp_path, reach={"any": True}) as c:
        c["admin"].create_table("t", SCHEMA)
        with pytest.raises(InvalidArgument, match="does not allow") as e:
            c["admin"].add_source("t", "f", "files", config={"root": "${GATEWAY_ONLY_VALUE}"})
        assert "do-not-leak-this-1" not in str(e.value)
        with pytest.raises(InvalidArgument, match="does not allow"):
            c["admin"].add_source(
                "t",
                "u",
                "flight",
                config={"location": "grpc://h:1", "token": "${HARNESS_TICKET_KEY}"},
            )
        # An allowed secret is used, but never shown back, even in errors.
        c["admin"].add_source(
            "t",
            "g",
            "files",
            config={"root": "${HARNESS_SECRET_ROOT}"},
            state={"files": ["x.parquet"]},
        )
        with pytest.raises(Exception) as e2:
            c["admin"].read("t")
        assert "secret-root-value" not in str(e2.value)


def test_a_writer_cannot_read_files_outside_the_allowed_roots(tmp_path: Path) -> None:
    with secure(tmp_path) as c:
        c["admin"].create_table("t", SCHEMA)
        with pytest.raises(Unauthorized, match="config 'root'"):
            c["admin"].add_source(
                "t",
                "etc",
                "files",
                config={"root": "/etc", "format": "csv"},
                state={"files": ["passwd"]},
            )
        with pytest.raises(Unauthorized):
            c["admin"].add_source("t", "abs", "files", state={"files": ["/etc/passwd"]})
        c["admin"].add_source("t", "ok", "files", config={"root": str(tmp_path / "data")})
        for escape in ("../c.db", "/etc/passwd", "sub/../../c.db"):
            with pytest.raises(InvalidArgument, match="outside the source's root"):
                c["writer"].commit("t", updates=[{"source": "ok", "state": {"files": [escape]}}])


def test_a_symlink_cannot_lead_out_of_the_root(tmp_path: Path) -> None:
    with secure(tmp_path) as c:
        c["admin"].create_table("t", SCHEMA)
        c["admin"].add_source("t", "ok", "files", config={"root": str(tmp_path / "data")})
        (tmp_path / "data" / "link.parquet").symlink_to(tmp_path / "c.db")
        with pytest.raises(InvalidArgument, match="outside the source's root"):
            c["writer"].commit(
                "t", updates=[{"source": "ok", "state": {"files": ["link.parquet"]}}]
            )


@pytest.mark.parametrize("plain_files", [3, 40])  # one lstat each / one directory listing
def test_a_symlink_among_many_files_cannot_lead_out_of_the_root(
    tmp_path: Path, plain_files: int
) -> None:
    """Files are resolved per directory (each directory once, then each name): a link among
    plain files is still resolved to where it leads, and refused."""
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    names = [f"p{i}.parquet" for i in range(plain_files)]
    for n in names:
        pq.write_table(pa.table({"id": [1], "v": ["x"]}), data / n)
    (data / "link.parquet").symlink_to(tmp_path / "c.db")
    with secure(tmp_path) as c:
        c["admin"].create_table("t", SCHEMA)
        c["admin"].add_source("t", "ok", "files", config={"root": str(data)})
        c["writer"].commit("t", updates=[{"source": "ok", "state": {"files": names}}])
        assert c["writer"].read("t").num_rows == plain_files
        with pytest.raises(InvalidArgument, match="outside the source's root"):
            c["writer"].commit(
                "t", updates=[{"source": "ok", "state": {"files": [*names, "link.parquet"]}}]
            )


def test_doput_never_overwrites_another_tables_file(tmp_path: Path) -> None:
    with secure(tmp_path) as c:
        for t in ("t1", "t2"):
            c["admin"].create_table(t, SCHEMA)
            c["admin"].add_source(t, "f", "files", config={"root": str(tmp_path / "data")})
        c["writer"].put("t1", pa.table({"id": [1], "v": ["one"]}), commit_id="same")
        c["writer"].put("t2", pa.table({"id": [2], "v": ["two"]}), commit_id="same")
        assert c["reader"].read("t1").to_pylist() == [{"id": 1, "v": "one"}]
        assert c["reader"].read("t2").to_pylist() == [{"id": 2, "v": "two"}]


@pytest.mark.parametrize(
    ("kind", "config"),
    [
        ("flight", {"location": "grpc://203.0.113.9:8815"}),
        ("postgres", {"dsn": "postgresql://u@203.0.113.9:5432/db", "table": "x"}),
        (
            "iceberg",
            {"catalog": {"type": "rest", "uri": "http://203.0.113.9/"}, "identifier": "a.b"},
        ),
        (
            "kafka",
            {
                "bootstrap_servers": "127.0.0.1:1",
                "topic": "t",
                "partition": 0,
                "schema_registry_url": "http://203.0.113.9/",
            },
        ),
        ("kafka", {"bootstrap_servers": "203.0.113.9:9092", "topic": "t", "partition": 0}),
        ("ducklake", {"metadata": "postgres:host=203.0.113.9 dbname=x", "table": "x"}),
    ],
)
def test_sources_cannot_make_the_gateway_connect_anywhere(
    tmp_path: Path, kind: str, config: dict
) -> None:
    with secure(tmp_path, reach={"hosts": ["127.0.0.1:1"], "paths": [str(tmp_path)]}) as c:
        c["admin"].create_table("t", SCHEMA)
        with pytest.raises(Unauthorized, match="does not allow"):
            c["admin"].add_source("t", "s", kind, config=config)
        assert c["admin"].describe("t").sources == ()


@pytest.mark.parametrize(
    ("kind", "config", "match"),
    [
        (
            "iceberg",
            {"catalog": {"type": "sql", "py-catalog-impl": "os.system"}, "identifier": "a.b"},
            "load code",
        ),
        (
            "iceberg",
            {"catalog": {"type": "sql", "py-io-impl": "evil.IO"}, "identifier": "a.b"},
            "load code",
        ),
        (
            "kafka",
            {
                "bootstrap_servers": "h:1",
                "topic": "t",
                "partition": 0,
                "consumer": {"plugin.library.paths": "/tmp/evil.so"},
            },
            "not allowed",
        ),
        (
            "kafka",
            {
                "bootstrap_servers": "h:1",
                "topic": "t",
                "partition": 0,
                "consumer": {"sasl.kerberos.kinit.cmd": "touch /tmp/pwned"},
            },
            "not allowed",
        ),
        (
            "kafka",
            {
                "bootstrap_servers": "h:1",
                "topic": "t",
                "partition": 0,
                "consumer": {"bootstrap.servers": "evil:9092"},
            },
            "not allowed",
        ),
        ("postgres", {"dsn": "service=prod", "table": "x"}, "not allowed"),
    ],
)
def test_settings_that_load_code_are_refused(
    tmp_path: Path, kind: str, config: dict, match: str
) -> None:
    with secure(tmp_path, reach={"any": True}) as c:
        c["admin"].create_table("t", SCHEMA)
        with pytest.raises(InvalidArgument, match=match):
            c["admin"].add_source("t", "s", kind, config=config)


# ---------------------------------------------------------------- locks


def test_locks_belong_to_their_owner(tmp_path: Path) -> None:
    with secure(tmp_path) as c:
        files_table(c, tmp_path)
        held = c["writer"].lock("t", ["f"], owner="mover", ttl_s=30)
        for other in ("writer2", "reader", "nothing"):
            with pytest.raises(Unauthorized):
                c[other].unlock(held.lock_id)
            with pytest.raises(Unauthorized):
                c[other].renew_lock(held.lock_id)
        with pytest.raises(Exception) as e:  # another writer's commit names the owner, not the id
            c["writer2"].commit("t", updates=[{"source": "f", "state": {"files": []}}])
        assert "writer:mover" in str(e.value) and held.lock_id not in str(e.value)
        c["admin"].renew_lock(held.lock_id)  # an admin of the table may
        c["writer"].commit("t", lock=held, updates=[{"source": "f", "state": {"files": []}}])
        c["writer"].unlock(held.lock_id)
        with pytest.raises(LockExpired):
            c["writer"].renew_lock(held.lock_id)
        summaries = [json.dumps(dict(h.summary)) for h in c["reader"].history("t")]
        assert not any(held.lock_id in s for s in summaries)


def test_lock_wait_is_bounded(tmp_path: Path) -> None:
    with secure(tmp_path, limits={"max_lock_wait_s": 5}) as c:
        files_table(c, tmp_path)
        with pytest.raises(InvalidArgument, match="limit"):
            c["writer"].lock("t", ["f"], wait_s=10**9)


# ---------------------------------------------------------------- resource exhaustion


def test_doput_checks_permission_before_reading_the_upload(tmp_path: Path) -> None:
    with secure(tmp_path) as c:
        files_table(c, tmp_path)
        from flight_gateway.core.write import ingest

        reads: list[int] = []
        real = ingest.read_upload
        ingest.read_upload = lambda reader, n: reads.append(1) or real(reader, n)  # type: ignore[assignment]
        try:
            with pytest.raises(Unauthorized):
                c["reader"].put("t", pa.table({"id": list(range(100_000)), "v": ["x"] * 100_000}))
        finally:
            ingest.read_upload = real  # type: ignore[assignment]
        assert reads == []


def test_uploads_are_bounded(tmp_path: Path) -> None:
    with secure(tmp_path, limits={"max_upload_bytes": 100_000}) as c:
        files_table(c, tmp_path)
        before = c["reader"].describe("t").version
        with pytest.raises(ResourceExhausted, match="max_upload_bytes"):
            c["writer"].put("t", pa.table({"id": list(range(50_000)), "v": ["x"] * 50_000}))
        assert c["reader"].describe("t").version == before


def test_a_huge_kafka_range_is_refused_not_planned(tmp_path: Path) -> None:
    with secure(tmp_path, reach={"hosts": ["127.0.0.1:9"]}) as c:
        c["admin"].create_table("t", SCHEMA)
        config = {"bootstrap_servers": "127.0.0.1:9", "topic": "x", "partition": 0}
        with pytest.raises(InvalidArgument, match="max_task_messages must be >= 1"):
            c["admin"].add_source("t", "k0", "kafka", config={**config, "max_task_messages": 0})
        c["admin"].add_source(
            "t",
            "k",
            "kafka",
            config={**config, "max_task_messages": 1},
            state={"low": 0, "high": 10**15},
        )
        with pytest.raises(InvalidArgument, match="tasks, more than"):
            c["reader"].flight_info("t")


def test_dedupe_and_since_are_bounded(tmp_path: Path) -> None:
    with secure(tmp_path, limits={"max_dedupe_rows": 1, "max_since_versions": 2}) as c:
        files_table(c, tmp_path)
        c["admin"].commit("t", properties={"x": 1})
        c["admin"].commit("t", properties={"x": 2})
        with pytest.raises(ResourceExhausted, match="since 0 is 3 versions behind"):
            c["reader"].flight_info("t", since=0)
    with secure(tmp_path / "b", limits={"max_dedupe_rows": 1}) as c:
        write_parquet(
            tmp_path / "b" / "data" / "a.parquet", pa.table({"id": [1, 2], "v": ["x", "y"]})
        )
        c["admin"].create_table("t", SCHEMA, primary_key=["id"])
        c["admin"].add_source(
            "t",
            "f",
            "files",
            config={"root": str(tmp_path / "b" / "data")},
            state={"files": ["a.parquet"]},
        )
        with pytest.raises(ResourceExhausted, match="max_dedupe_rows"):
            c["reader"].read("t", dedupe=True)
        assert c["reader"].list_tables() == ["t"]  # the gateway is still up


def test_concurrent_streams_per_principal_are_bounded(tmp_path: Path) -> None:
    with secure(tmp_path, limits={"max_streams_per_principal": 1}) as c:
        n = 3_000_000  # more than flow control lets the server send ahead: the stream stays open
        big = pa.table({"id": pa.array(range(n), pa.int64()), "v": ["x"] * n})
        write_parquet(tmp_path / "data" / "big.parquet", big)
        c["admin"].create_table("t", SCHEMA)
        c["admin"].add_source(
            "t",
            "f",
            "files",
            config={"root": str(tmp_path / "data")},
            state={"files": ["big.parquet"]},
        )
        info = c["reader"].flight_info("t")
        first = c["reader"].read_endpoint(info.endpoints[0])
        first.read_next_batch()  # open and in progress
        with pytest.raises(ResourceExhausted, match="max_streams_per_principal"):
            c["reader"].read_endpoint(info.endpoints[0]).read_next_batch()
        assert sum(b.num_rows for b in first) + 65536 >= n  # the first stream is unharmed
        # Once it ends, the slot is free again.
        assert c["writer"].read("t", columns=["id"], limit=5).num_rows == 5
        assert c["reader"].read("t", columns=["id"], limit=5).num_rows == 5


# ---------------------------------------------------------------- redaction and TLS


def test_describe_redacts_every_secret_looking_key(tmp_path: Path) -> None:
    with secure(tmp_path, reach={"any": True}) as c:
        c["admin"].create_table("t", SCHEMA)
        catalog = {
            "type": "rest",
            "uri": "http://127.0.0.1:1/",
            "s3.secret-access-key": "AKIA-secret-1",
            "header.Authorization": "Bearer secret-2",
            "credential": 12345678,
            "nested": {"api_key": "secret-3"},
        }
        c["admin"].add_source("t", "i", "iceberg", config={"catalog": catalog, "identifier": "a.b"})
        shown = json.dumps(dict(c["reader"].describe("t").source("i").config))
        for secret in ("AKIA-secret-1", "secret-2", "12345678", "secret-3"):
            assert secret not in shown


def test_half_a_tls_configuration_is_a_start_up_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        GatewayConfig(tls_cert=str(tmp_path / "cert.pem"))
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        GatewayConfig(tls_key=str(tmp_path / "key.pem"))


def test_no_secret_in_any_error_or_log_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "Sup3r-Secret-Value-42"
    monkeypatch.setenv("HARNESS_SECRET_PW", secret)
    caplog.set_level(logging.DEBUG)
    errors: list[str] = []
    with secure(tmp_path, reach={"any": True}) as c:
        c["admin"].create_table("t", SCHEMA)
        bad_configs = {
            "pg": (
                "postgres",
                {"dsn": "postgresql://u:${HARNESS_SECRET_PW}@127.0.0.1:1/x", "table": "x"},
            ),
            "ice": (
                "iceberg",
                {
                    "catalog": {"type": "sql", "uri": "sqlite:////no/${HARNESS_SECRET_PW}.db"},
                    "identifier": "a.b",
                },
            ),
            "lake": ("ducklake", {"metadata": "/no/${HARNESS_SECRET_PW}/x", "table": "t"}),
            "fl": ("flight", {"location": "grpc://127.0.0.1:1", "token": "${HARNESS_SECRET_PW}"}),
            "f": ("files", {"root": "/no/${HARNESS_SECRET_PW}"}),
        }
        for name, (kind, config) in bad_configs.items():
            state = (
                {"files": ["a.parquet"]}
                if kind == "files"
                else {"snapshot_id": 1, "as_of": "2024-01-01T00:00:00Z"}
            )
            state = {k: v for k, v in state.items() if kind != "flight"}
            try:
                c["admin"].add_source(
                    "t",
                    name,
                    kind,
                    config=config,
                    state={"files": ["a.parquet"]}
                    if kind == "files"
                    else {"as_of": "2024-01-01T00:00:00+00:00"}
                    if kind == "postgres"
                    else {"snapshot_id": 1}
                    if kind in ("iceberg", "ducklake")
                    else {},
                )
            except Exception as e:  # some fail at commit already
                errors.append(str(e))
            try:
                c["reader"].read("t", sources=[name])
            except Exception as e:
                errors.append(str(e))
        errors.append(json.dumps(c["reader"].describe("t").__dict__, default=str))
    assert errors and all(secret not in e for e in errors)
    assert secret not in caplog.text
