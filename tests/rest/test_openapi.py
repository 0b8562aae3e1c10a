"""Every response of the Iceberg REST face, errors included, is valid against the Iceberg REST
OpenAPI spec (apache/iceberg ``open-api/rest-catalog-open-api.yaml``, vendored beside this
test): what Trino, Spark and Flink's Iceberg REST clients parse."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.gateway.helpers import client_for, running_gateway
from tests.rest.helpers import check_schema, get

READER = "reader-token-0123456789"
TOKENS = {READER: {"name": "reader", "read": ["t"]}, "admin-token-0123456789": {"name": "admin", "admin": ["*"]}}  # fmt: skip


def test_responses_follow_the_spec(tmp_path: Path) -> None:
    root = tmp_path / "f"
    root.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "name": ["a", "b"]}), root / "a.parquet")
    (root / "b.csv").write_text("id,name\n3,c\n")
    with running_gateway(f"sqlite:///{tmp_path / 'c.db'}", tokens=TOKENS, allow_anonymous=False,
                         reach={"any": True}, iceberg_rest_port=0) as (server, _):  # fmt: skip
        admin = client_for(server, "admin-token-0123456789")
        admin.create_table("t", [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"},
                                 {"name": "tags", "type": "list<item: string>"}])  # fmt: skip
        admin.add_source("t", "f", "files", config={"root": str(root)}, state={"files": ["a.parquet"]})  # fmt: skip
        admin.add_source("t", "c", "files", config={"root": str(root), "format": "csv"},
                         state={"files": ["b.csv"]})  # fmt: skip
        base = f"http://127.0.0.1:{server.rest.port}/v1"
        for path, schema in (
            ("/config", "CatalogConfig"),
            ("/namespaces", "ListNamespacesResponse"),
            ("/namespaces/harness", "GetNamespaceResponse"),
            ("/namespaces/harness/tables", "ListTablesResponse"),
            ("/namespaces/harness/tables/t", "LoadTableResult"),
            ("/namespaces/harness/tables/t?version=1", "LoadTableResult"),
        ):
            status, body = get(base + path, READER)
            assert status == 200, (path, body)
            check_schema(schema, body)
        assert get(base + "/namespaces/harness/tables/t", READER, method="HEAD")[0] == 204
        for path, token, code in (
            ("/namespaces", None, 401),
            ("/namespaces", "wrong-token", 401),
            ("/namespaces/harness/tables/nope", READER, 404),
            ("/namespaces/other/tables/t", READER, 404),
            ("/namespaces/harness/tables/t?version=abc", READER, 400),
            ("/namespaces/harness/tables/t?version=99", READER, 404),
        ):
            status, body = get(base + path, token)
            assert status == code, (path, body)
            check_schema("IcebergErrorResponse", body)
        req = urllib.request.Request(base + "/namespaces/harness/tables", data=b"{}", method="POST",
                                     headers={"Authorization": f"Bearer {READER}"})  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req)
        assert refused.value.code == 403
        check_schema("IcebergErrorResponse", json.loads(refused.value.read()))
        admin.close()
