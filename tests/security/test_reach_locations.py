"""Security II (issue 21): ``reach`` holds for every location a source makes the gateway touch.

One test per finding of the audit, each failing before its fix: percent-encoded ``file://``
roots, files named inside Iceberg / Delta / Paimon / DuckLake metadata, secrets sent to unlisted
hosts through network settings (a loopback listener is the witness), Postgres ``hostaddr``, S3
URI query parameters, reader errors echoing file content, and secrets scoped to tables.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flight_gateway.protocol.errors import HarnessError, InvalidArgument, Unauthorized
from tests.gateway.helpers import DuckLakeFixture, IcebergFixture, write_parquet
from tests.security.listener import http_listener
from tests.security.test_findings import SCHEMA, secure

ROWS = pa.table({"id": [1, 2], "v": ["x", "y"]})
OUTSIDE = pa.table({"id": [666], "v": ["outside-secret-row"]})


def outside_file(tmp_path: Path) -> str:
    """A Parquet file outside the allowed ``tmp_path/data``."""
    return write_parquet(tmp_path / "other" / "secret.parquet", OUTSIDE)


# ---------------------------------------------------------------- 1. encoded file:// roots


@pytest.mark.parametrize(
    "suffix", ["%2e%2e/other", "%2E%2E/other", "sub/%2e%2e/%2e%2e/other", "%2e%2e%2fother"]
)
def test_percent_encoded_file_root_cannot_leave_the_allowed_path(
    tmp_path: Path, suffix: str
) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "passwd.csv").write_text("id,v\n1,root:x:0:0\n")
    with secure(tmp_path) as c:
        c["admin"].create_table("t", SCHEMA)
        with pytest.raises(Unauthorized, match="config 'root'"):
            c["admin"].add_source("t", "f", "files",
                                  config={"root": f"file://{tmp_path}/data/{suffix}",
                                          "format": "csv", "direct": True},
                                  state={"files": ["passwd.csv"]})  # fmt: skip
        assert c["admin"].describe("t").sources == ()


def test_reader_errors_never_echo_file_content(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "short.csv").write_text("id,v\n1,a\nSECRET-LINE-0001\n")
    (tmp_path / "data" / "typed.csv").write_text("id,v\n1,a\nSECRET-VALUE-0002,b\n")
    with secure(tmp_path) as c:
        for name, secret in (("short", "SECRET-LINE-0001"), ("typed", "SECRET-VALUE-0002")):
            c["admin"].create_table(f"t{name}", SCHEMA)
            c["admin"].add_source(f"t{name}", name, "files",
                                  config={"root": str(tmp_path / "data"), "format": "csv"},
                                  state={"files": [f"{name}.csv"]})  # fmt: skip
            with pytest.raises((HarnessError, pa.ArrowException)) as e:
                c["reader"].read(f"t{name}")
            assert secret not in str(e.value)
            if name == "short":  # the position stays
                assert "Row #3: Expected 2 columns, got 1" in str(e.value)


# ---------------------------------------------------------------- 2. files named in metadata


def test_iceberg_data_files_outside_reach_are_never_read_or_signed(tmp_path: Path) -> None:
    ice = IcebergFixture(tmp_path / "data" / "ice")
    table = ice.create("t", pa.schema([("id", pa.int64()), ("v", pa.string())]))
    table.append(ROWS)
    table.add_files([outside_file(tmp_path)])  # metadata now lists a file outside the lake
    with secure(tmp_path) as c:
        c["admin"].create_table("t", SCHEMA)
        c["admin"].add_source("t", "ice", "iceberg", config={**ice.source_config("t"), "direct": True},
                              state={"snapshot_id": table.current_snapshot().snapshot_id})  # fmt: skip
        for kwargs in ({}, {"direct": True}):
            with pytest.raises(Unauthorized, match=r"data file|Iceberg") as e:
                c["reader"].read("t", **kwargs)
            assert "outside-secret-row" not in str(e.value)


def test_iceberg_metadata_outside_reach_is_never_opened(tmp_path: Path) -> None:
    """A catalog entry (the catalog itself is allowed) pointing at metadata outside the lake."""
    elsewhere = IcebergFixture(tmp_path / "other" / "ice")
    foreign = elsewhere.create("t", pa.schema([("id", pa.int64()), ("v", pa.string())]))
    foreign.append(OUTSIDE)
    ice = IcebergFixture(tmp_path / "data" / "ice")
    ice.catalog.register_table("db.stolen", foreign.metadata_location)
    snap = foreign.current_snapshot().snapshot_id
    with secure(tmp_path) as c:
        c["admin"].create_table("t", SCHEMA)
        c["admin"].add_source("t", "ice", "iceberg", config=ice.source_config("stolen"),
                              state={"snapshot_id": snap})  # fmt: skip
        with pytest.raises(Unauthorized, match="Iceberg metadata"):
            c["reader"].read("t")


def _delta_table_with_escaping_file(tmp_path: Path) -> str:
    import deltalake

    uri = str(tmp_path / "data" / "delta")
    deltalake.write_deltalake(uri, ROWS)
    outside = outside_file(tmp_path)
    add = {"add": {"path": os.path.relpath(outside, uri), "size": os.path.getsize(outside),
                   "partitionValues": {}, "modificationTime": 1, "dataChange": True}}  # fmt: skip
    log = Path(uri) / "_delta_log" / "00000000000000000001.json"
    log.write_text(json.dumps({"commitInfo": {"operation": "WRITE"}}) + "\n" + json.dumps(add))
    return uri


def test_delta_log_cannot_name_files_outside_reach(tmp_path: Path) -> None:
    uri = _delta_table_with_escaping_file(tmp_path)
    with secure(tmp_path) as c:
        c["admin"].create_table("t", SCHEMA)
        c["admin"].add_source("t", "d", "delta", config={"uri": uri, "direct": True},
                              state={"version": 1})  # fmt: skip
        for kwargs in ({}, {"direct": True}):
            with pytest.raises(Unauthorized, match="data file") as e:
                c["reader"].read("t", **kwargs)
            assert "outside-secret-row" not in str(e.value)


@pytest.mark.integration
def test_hudi_partition_linked_outside_reach_is_refused(tmp_path: Path, hudi_spark: Any) -> None:
    """A Hudi partition directory replaced by a symlink to a directory outside the reach: the
    files its slices name resolve outside, so reads (and direct tasks) are refused."""
    import shutil

    uri = tmp_path / "data" / "hudi"
    rows = pa.table({"id": [1, 2, 666], "v": ["x", "y", "outside-secret-row"]})
    instant = hudi_spark.write(str(uri), rows, partition="v")
    part = uri / "v=outside-secret-row"
    moved = tmp_path / "other" / "part"
    moved.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(part, moved)
    part.symlink_to(moved)
    with secure(tmp_path) as c:
        c["admin"].create_table("t", SCHEMA)
        c["admin"].add_source("t", "h", "hudi", config={"uri": str(uri), "direct": True},
                              state={"instant": instant})  # fmt: skip
        for kwargs in ({}, {"direct": True}):
            with pytest.raises(Unauthorized, match="data file") as e:
                c["reader"].read("t", **kwargs)
            assert "outside-secret-row" not in str(e.value)


def test_paimon_external_data_paths_outside_reach_are_refused(tmp_path: Path) -> None:
    from pypaimon import CatalogFactory, Schema

    warehouse = tmp_path / "data" / "wh"
    catalog = CatalogFactory.create({"warehouse": str(warehouse)})
    catalog.create_database("db", True)
    (tmp_path / "other").mkdir()
    options = {"data-file.external-paths": f"file://{tmp_path / 'other'}",
               "data-file.external-paths.strategy": "round-robin"}  # fmt: skip
    arrow = pa.schema([("id", pa.int64()), ("v", pa.string())])
    catalog.create_table("db.t", Schema.from_pyarrow_schema(arrow, options=options), False)
    table = catalog.get_table("db.t")
    builder = table.new_batch_write_builder()
    write, commit = builder.new_write(), builder.new_commit()
    write.write_arrow(OUTSIDE)
    commit.commit(write.prepare_commit())
    write.close()
    commit.close()
    assert any((tmp_path / "other").rglob("*.parquet"))  # the data really lies outside
    snap = table.snapshot_manager().get_latest_snapshot().id
    with secure(tmp_path) as c:
        c["admin"].create_table("t", SCHEMA)
        c["admin"].add_source("t", "p", "paimon",
                              config={"warehouse": str(warehouse), "identifier": "db.t"},
                              state={"snapshot_id": snap})  # fmt: skip
        with pytest.raises(Unauthorized, match="data file"):
            c["reader"].read("t")


def test_ducklake_files_outside_reach_are_refused(tmp_path: Path) -> None:
    lake = DuckLakeFixture(tmp_path / "data" / "lake")
    outside = outside_file(tmp_path)
    snap = lake.execute("CREATE TABLE lake.t (id BIGINT, v VARCHAR)",
                        f"CALL ducklake_add_data_files('lake', 't', '{outside}')")  # fmt: skip
    with secure(tmp_path) as c:
        c["admin"].create_table("t", SCHEMA)
        c["admin"].add_source("t", "l", "ducklake", config=lake.source_config("t"),
                              state={"snapshot_id": snap})  # fmt: skip
        with pytest.raises(Unauthorized, match="data file"):
            c["reader"].read("t")


# ---------------------------------------------------------------- 3-5. network settings

KAFKA = {"topic": "t", "partition": 0}


def _network_cases(url: str, host: str) -> list[tuple[str, dict[str, Any]]]:
    """A source config per network key of every kind, each pointing at the listener (``url``,
    ``host``) while everything else it names is allowed."""
    secret = "${HARNESS_SECRET_TOKEN}"
    rest = {"type": "rest", "uri": "http://127.0.0.1:9/"}
    return [
        ("iceberg", {"catalog": {**rest, "credential": secret, "oauth2-server-uri": f"{url}/t"},
                     "identifier": "db.t"}),
        ("iceberg", {"catalog": {"type": "rest", "uri": f"{url}/"}, "identifier": "db.t"}),
        ("iceberg", {"catalog": {**rest, "s3.endpoint": url}, "identifier": "db.t"}),
        ("iceberg", {"catalog": {**rest, "s3.proxy-uri": url}, "identifier": "db.t"}),
        ("kafka", {**KAFKA, "bootstrap_servers": "127.0.0.1:9",
                   "consumer": {"security.protocol": "SASL_PLAINTEXT",
                                "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
                                "sasl.oauthbearer.client.id": "x",
                                "sasl.oauthbearer.client.secret": secret,
                                "sasl.oauthbearer.token.endpoint.url": url}}),
        ("kafka", {**KAFKA, "bootstrap_servers": "127.0.0.1:9", "format": "avro",
                   "schema_registry_url": f"http://127.0.0.1:9/,{url}"}),
        ("kafka", {**KAFKA, "bootstrap_servers": f"127.0.0.1:9,{host}"}),
        ("files", {"root": f"s3://bucket/lake?endpoint_override={host}&scheme=http"}),
        ("delta", {"uri": "s3://bucket/lake/d", "storage_options": {"AWS_ENDPOINT_URL": url}}),
        ("hudi", {"uri": "s3://bucket/lake/h", "storage_options": {"AWS_ENDPOINT_URL": url}}),
        ("paimon", {"warehouse": "s3://bucket/lake/wh", "identifier": "db.t",
                    "catalog_options": {"fs.s3.endpoint": url}}),
        ("postgres", {"dsn": f"host=pg.example hostaddr=127.0.0.1 port={host.split(':')[1]}",
                      "table": "t"}),
        ("flight", {"location": f"grpc://{host}", "descriptor": {"path": ["x"]}}),
    ]  # fmt: skip


def test_no_request_reaches_an_unlisted_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARNESS_SECRET_TOKEN", "token-that-must-not-travel")
    with http_listener() as listener:
        port = listener.port
        reach = {"paths": ["s3://bucket/lake"], "uris": ["http://127.0.0.1:9/"],
                 "hosts": ["127.0.0.1:9", f"pg.example:{port}"]}  # fmt: skip
        with secure(tmp_path, reach=reach) as c:
            c["admin"].create_table("t", SCHEMA)
            for i, (kind, config) in enumerate(_network_cases(listener.url, listener.host)):
                with pytest.raises(Unauthorized, match="does not allow"):
                    c["admin"].add_source("t", f"s{i}", kind, config=config)
            assert c["admin"].describe("t").sources == ()
        assert listener.requests == []


def test_the_listener_sees_requests_to_an_allowed_host(tmp_path: Path) -> None:
    """The witness above can see a request: allow the listener and a read contacts it."""
    with http_listener() as listener, secure(tmp_path, reach={"uris": [listener.url]}) as c:
        c["admin"].create_table("t", SCHEMA)
        c["admin"].add_source("t", "ice", "iceberg",
                              config={"catalog": {"type": "rest", "uri": listener.url},
                                      "identifier": "db.t"},
                              state={"snapshot_id": 1})  # fmt: skip
        with pytest.raises(HarnessError):
            c["reader"].read("t")
        assert listener.requests


@pytest.mark.parametrize(
    ("kind", "config"),
    [
        (
            "iceberg",
            {
                "catalog": {"type": "rest", "uri": "http://127.0.0.1:9/", "adls.account-host": "x"},
                "identifier": "db.t",
            },
        ),
        ("iceberg", {"catalog": {"type": "glue"}, "identifier": "db.t"}),
        (
            "kafka",
            {
                **KAFKA,
                "bootstrap_servers": "127.0.0.1:9",
                "consumer": {"socks5.proxy": "127.0.0.1:1080"},
            },
        ),
        ("delta", {"uri": "s3://bucket/lake/d", "storage_options": {"proxy_url": "http://p"}}),
        ("hudi", {"uri": "s3://bucket/lake/h", "storage_options": {"proxy_url": "http://p"}}),
        ("files", {"root": "s3://bucket/lake?tls_ca_file_path=/etc/passwd"}),
        ("files", {"root": "file:///srv/lake?x=1"}),
    ],
)
def test_network_settings_it_cannot_check_are_refused(
    tmp_path: Path, kind: str, config: dict[str, Any]
) -> None:
    reach = {"paths": ["s3://bucket/lake", "/srv/lake"], "uris": ["http://127.0.0.1:9/"],
             "hosts": ["127.0.0.1:9"]}  # fmt: skip
    with secure(tmp_path, reach=reach) as c:
        c["admin"].create_table("t", SCHEMA)
        with pytest.raises(InvalidArgument, match=r"not allowed|not supported"):
            c["admin"].add_source("t", "s", kind, config=config)


# ---------------------------------------------------------------- secrets scoped to tables


def test_secrets_can_be_scoped_to_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_SECRET_TEAM_A_ROOT", str(tmp_path / "data"))
    write_parquet(tmp_path / "data" / "a.parquet", ROWS)
    rules = {"allow": [{"names": ["HARNESS_SECRET_TEAM_A_*"], "tables": ["a.*"]}]}
    tokens = {"admin-token": {"name": "admin", "admin": ["*"]}}
    with secure(tmp_path, secrets=rules, tokens=tokens) as c:
        config = {"root": "${HARNESS_SECRET_TEAM_A_ROOT}"}
        for table in ("a.events", "b.events"):
            c["admin"].create_table(table, SCHEMA)
        c["admin"].add_source("a.events", "f", "files", config=config,
                              state={"files": ["a.parquet"]})  # fmt: skip
        assert c["admin"].read("a.events").num_rows == 2
        with pytest.raises(InvalidArgument, match=r"for table 'b\.events'"):
            c["admin"].add_source("b.events", "f", "files", config=config,
                                  state={"files": ["a.parquet"]})  # fmt: skip


def test_a_bad_secrets_rule_stops_the_gateway(tmp_path: Path) -> None:
    from flight_gateway.app import GatewayConfig

    with pytest.raises(ValueError, match=r"secrets\.allow"):
        GatewayConfig(port=0, ticket_key="k" * 32, secrets={"allow": [{"tables": ["a"]}]})


def test_parquet_written_by_pyarrow_is_readable_directly(tmp_path: Path) -> None:
    """Direct tasks still work for files inside the allowed root (the checks are not a blanket
    refusal)."""
    pq.write_table(ROWS, tmp_path / "ok.parquet")
    (tmp_path / "data").mkdir()
    os.replace(tmp_path / "ok.parquet", tmp_path / "data" / "ok.parquet")
    with secure(tmp_path) as c:
        c["admin"].create_table("t", SCHEMA)
        c["admin"].add_source("t", "f", "files",
                              config={"root": f"file://{tmp_path}/data", "direct": True},
                              state={"files": ["ok.parquet"]})  # fmt: skip
        assert c["reader"].read("t", direct=True).num_rows == 2
