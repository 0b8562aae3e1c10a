"""How the contract suite sets up each kind: a source over real storage, and writes made with the
kind's own library, outside the harness (the way data reaches cold and hot storage in real life).

Adding a kind to the contract suite = adding one ``Adapter`` here and its name to ``ADAPTERS``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

#: The contract's table: one column of each common type.
ARROW = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
SCHEMA = [{"name": f.name, "type": str(f.type)} for f in ARROW]


@dataclass
class Env:
    """What adapters may use: a scratch directory and the session's services."""

    tmp: Path
    services: Callable[[str], Any]  # pytest's getfixturevalue, for pg_dsn / kafka_bootstrap / ...


class Adapter:
    kind: str = ""
    #: The adapter's name in test ids (a kind may have several, e.g. one per file format).
    name: str = ""
    #: Services (fixture names) the adapter needs.
    needs: tuple[str, ...] = ()
    #: Capabilities the kind has but not for this adapter's sources (e.g. DoPut into Avro).
    lacks: tuple[str, ...] = ()

    def create(self, env: Env, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """A fresh empty physical source: (config, initial state)."""
        raise NotImplementedError

    def write(
        self, env: Env, config: Mapping[str, Any], state: Mapping[str, Any], rows: pa.Table
    ) -> dict[str, Any]:
        """Append ``rows`` with the kind's own library; the state that makes them visible."""
        raise NotImplementedError

    def bad_config(self) -> dict[str, Any]:
        """A config the kind must refuse at commit time."""
        return {"no_such_key": 1}


class FilesAdapter(Adapter):
    kind = "files"

    def create(self, env: Env, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        root = env.tmp / f"files-{name}"
        root.mkdir(parents=True)
        return {"root": str(root)}, {"files": []}

    def write(self, env, config, state, rows):
        name = f"{uuid.uuid4().hex}.parquet"
        pq.write_table(rows, Path(config["root"]) / name)
        return {"files": [*state["files"], name]}


class AvroFilesAdapter(Adapter):
    """``files`` sources of Avro container files written with fastavro."""

    kind = "files"
    name = "files-avro"
    lacks = ("append", "direct")

    def create(self, env: Env, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        root = env.tmp / f"avro-{name}"
        root.mkdir(parents=True)
        return {"root": str(root), "format": "avro"}, {"files": []}

    def write(self, env, config, state, rows):
        import fastavro

        fields = []
        for f in rows.schema:
            avro = {"int64": "long", "string": "string", "double": "double"}[str(f.type)]
            fields.append({"name": f.name, "type": ["null", avro]})
        schema = {"type": "record", "name": "row", "fields": fields}
        name = f"{uuid.uuid4().hex}.avro"
        with open(Path(config["root"]) / name, "wb") as out:
            fastavro.writer(out, fastavro.parse_schema(schema), rows.to_pylist())
        return {"files": [*state["files"], name]}


class IcebergAdapter(Adapter):
    kind = "iceberg"
    needs = ("iceberg",)

    def create(self, env, name):
        ice = env.services("iceberg")
        ident = f"contract_{name}_{uuid.uuid4().hex[:6]}"
        ice.create(ident, ARROW)
        return ice.source_config(ident), {"snapshot_id": None}

    def write(self, env, config, state, rows):
        ice = env.services("iceberg")
        table = ice.catalog.load_table(config["identifier"])
        table.append(rows)
        return {"snapshot_id": table.current_snapshot().snapshot_id}


class DuckLakeAdapter(Adapter):
    kind = "ducklake"
    needs = ("ducklake",)

    def create(self, env, name):
        lake = env.services("ducklake")
        table = f"c_{name}_{uuid.uuid4().hex[:6]}"
        snap = lake.execute(f"CREATE TABLE lake.{table} (id BIGINT, name VARCHAR, amount DOUBLE)")
        return lake.source_config(table), {"snapshot_id": snap}

    def write(self, env, config, state, rows):
        from planners.ducklake import connect

        con = connect(config, read_only=False)
        try:
            con.register("incoming", rows)
            cols = ", ".join(f'"{c}"' for c in rows.column_names)
            con.execute(f"INSERT INTO lake.{config['table']} ({cols}) SELECT {cols} FROM incoming")
            return {
                "snapshot_id": int(
                    con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0]
                )
            }
        finally:
            con.close()


class KafkaAdapter(Adapter):
    kind = "kafka"
    needs = ("kafka_bootstrap",)

    def create(self, env, name):
        from tests.gateway.kafka_helpers import new_topic

        bootstrap = env.services("kafka_bootstrap")
        config = {"bootstrap_servers": bootstrap, "topic": new_topic(bootstrap), "partition": 0}
        return config, {"low": 0, "high": 0}

    def write(self, env, config, state, rows):
        from tests.gateway.kafka_helpers import produce

        values = [json.dumps(r).encode() for r in rows.to_pylist()]
        offsets = produce(config["bootstrap_servers"], config["topic"], values)
        return {"low": state["low"], "high": max(offsets) + 1}


class PostgresAdapter(Adapter):
    kind = "postgres"
    needs = ("pg_dsn",)

    def create(self, env, name):
        from tests.gateway.helpers import versioned_table

        dsn = env.services("pg_dsn")
        table, as_of = versioned_table(
            dsn, f"c_{name}", "id bigint, name text, amount double precision"
        )
        return {"dsn": dsn, "table": table}, {"as_of": as_of}

    def write(self, env, config, state, rows):
        import psycopg

        from planners.postgres.versioning import server_now

        cols = ", ".join(f'"{c}"' for c in rows.column_names)
        marks = ", ".join(["%s"] * rows.num_columns)
        with psycopg.connect(config["dsn"]) as conn:
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(
                    f'INSERT INTO "{config["table"]}" ({cols}) VALUES ({marks})',
                    [tuple(r.values()) for r in rows.to_pylist()],
                )
            return {"as_of": server_now(conn)}


class DeltaAdapter(Adapter):
    """Delta tables created and appended to by delta-rs itself."""

    kind = "delta"

    def create(self, env, name):
        from deltalake import write_deltalake

        uri = str(env.tmp / f"delta-{name}")
        write_deltalake(uri, ARROW.empty_table())
        return {"uri": uri}, {"version": 0}

    def write(self, env, config, state, rows):
        from deltalake import DeltaTable, write_deltalake

        write_deltalake(config["uri"], rows, mode="append")
        return {"version": DeltaTable(config["uri"]).version()}

    def bad_config(self):
        return {"uri": 42}


class HudiAdapter(Adapter):
    """Hudi tables written by Spark with Hudi's own Spark bundle (inserts keyed by ``id``)."""

    kind = "hudi"
    needs = ("hudi_spark",)
    table_type = "COPY_ON_WRITE"

    def create(self, env, name):
        return {"uri": str(env.tmp / f"hudi-{name}")}, {"instant": None}

    def write(self, env, config, state, rows):
        spark = env.services("hudi_spark")
        return {"instant": spark.write(config["uri"], rows, table_type=self.table_type)}

    def bad_config(self):
        return {"uri": ["not", "a", "path"]}


class HudiMergeOnReadAdapter(HudiAdapter):
    name = "hudi-mor"
    table_type = "MERGE_ON_READ"


class PaimonAdapter(Adapter):
    """Append-only Paimon tables created and written by pypaimon itself."""

    kind = "paimon"

    def create(self, env, name):
        from pypaimon import CatalogFactory, Schema

        warehouse = str(env.tmp / "paimon")
        catalog = CatalogFactory.create({"warehouse": warehouse})
        catalog.create_database("contract", True)
        ident = f"contract.t_{name}_{uuid.uuid4().hex[:6]}"
        catalog.create_table(ident, Schema.from_pyarrow_schema(ARROW), False)
        return {"warehouse": warehouse, "identifier": ident}, {"snapshot_id": None}

    def write(self, env, config, state, rows):
        from pypaimon import CatalogFactory

        table = CatalogFactory.create({"warehouse": config["warehouse"]}).get_table(
            config["identifier"]
        )
        builder = table.new_batch_write_builder()
        write, commit = builder.new_write(), builder.new_commit()
        names = [f.name for f in table.fields]
        write.write_arrow(rows.select([n for n in names if n in rows.column_names]))
        commit.commit(write.prepare_commit())
        write.close()
        commit.close()
        return {"snapshot_id": table.snapshot_manager().get_latest_snapshot().id}

    def bad_config(self):
        return {"warehouse": "/nowhere"}  # no identifier


class JsonLinesAdapter(Adapter):
    """The out-of-tree plugin kind (tests/plugins/harness_jsonl)."""

    kind = "jsonl"
    needs = ("jsonl_kind",)

    def create(self, env, name):
        return {"path": str(env.tmp / f"{name}.jsonl")}, {"lines": 0, "bytes": 0}

    def write(self, env, config, state, rows):
        data = b"".join(json.dumps(r).encode() + b"\n" for r in rows.to_pylist())
        with open(config["path"], "ab") as f:
            f.write(data)
        return {"lines": state["lines"] + rows.num_rows, "bytes": state["bytes"] + len(data)}


ADAPTERS: dict[str, Adapter] = {
    a.name or a.kind: a
    for a in (
        FilesAdapter(),
        AvroFilesAdapter(),
        IcebergAdapter(),
        DuckLakeAdapter(),
        KafkaAdapter(),
        PostgresAdapter(),
        DeltaAdapter(),
        HudiAdapter(),
        HudiMergeOnReadAdapter(),
        PaimonAdapter(),
        JsonLinesAdapter(),
    )
}
