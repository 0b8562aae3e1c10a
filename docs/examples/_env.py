"""What the examples need, started locally: a gateway, a Kafka-protocol broker, a scratch
Postgres database and an Iceberg catalog. The Postgres server is the one at HARNESS_PG_DSN
(default the loopback one), or one started for the example when nothing answers there
(flight_gateway/local/postgres.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyiceberg.catalog.sql import SqlCatalog

from clients import HarnessClient
from flight_gateway.app import GatewayConfig, HarnessFlightServer
from flight_gateway.catalog import Catalog
from flight_gateway.local.kafka import local_broker
from flight_gateway.local.postgres import admin_dsn, session_server

PG_ADMIN = admin_dsn()


@dataclass
class Env:
    client: HarnessClient
    bootstrap: str
    pg_dsn: str
    root: Path
    iceberg: SqlCatalog
    iceberg_props: dict[str, Any]

    def topic(self, name: str, partitions: int) -> str:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for f in admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)]
        ).values():
            f.result(30)
        return name

    def produce(
        self, topic: str, rows: list[tuple[int, bytes | None, dict[str, Any] | None]]
    ) -> None:
        """(partition, key, value-or-None) messages, acknowledged before returning."""
        p = Producer(
            {"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 2}
        )
        for partition, key, value in rows:
            p.produce(
                topic,
                key=key,
                value=None if value is None else json.dumps(value).encode(),
                partition=partition,
            )
        assert p.flush(30) == 0

    def shards(self, count: int) -> list[str]:
        """DSNs of ``count`` Postgres shard servers: HARNESS_PG_SHARDS (comma-separated DSNs of
        separate servers, as the tests pass them), else the example's own database repeated
        (one server: the shards are then separate tables, not separate servers)."""
        given = [d for d in os.environ.get("HARNESS_PG_SHARDS", "").split(",") if d]
        if given:
            if len(given) < count:
                raise SystemExit(f"HARNESS_PG_SHARDS names {len(given)} servers, need {count}")
            return given[:count]
        logging.getLogger("examples").warning(
            "HARNESS_PG_SHARDS not set: all %d shards on one Postgres server", count
        )
        return [self.pg_dsn] * count

    def iceberg_source(self, identifier: str) -> dict[str, Any]:
        return {"catalog": {"type": "sql", **self.iceberg_props}, "identifier": identifier}


@contextlib.contextmanager
def environment(*, catalog_in_postgres: bool = False) -> Iterator[Env]:
    """``catalog_in_postgres``: keep the harness catalog in the scratch Postgres database too."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("flight_gateway").setLevel(logging.WARNING)
    logging.getLogger("pipelines").setLevel(logging.WARNING)
    logging.getLogger("pypaimon").setLevel(logging.WARNING)
    # pyiceberg logs "Loaded FileIO: ..." at INFO for every table it opens (~50 per run).
    logging.getLogger("pyiceberg").setLevel(logging.WARNING)
    with session_server(PG_ADMIN) as pg, _scratch_database() as pg_dsn:
        logging.getLogger("examples").info("%s", pg.describe())
        with tempfile.TemporaryDirectory() as tmp, local_broker() as bootstrap:
            root = Path(tmp)
            (root / "warehouse").mkdir()
            props = {
                "uri": f"sqlite:///{root / 'iceberg.db'}",
                "warehouse": f"file://{root / 'warehouse'}",
            }
            ice = SqlCatalog("default", **props)
            ice.create_namespace("db")
            catalog = Catalog(pg_dsn if catalog_in_postgres else f"sqlite:///{root / 'harness.db'}")
            server = HarnessFlightServer(
                catalog, GatewayConfig(port=0, allow_anonymous=True, ticket_key=uuid.uuid4().hex)
            )
            threading.Thread(target=server.serve, daemon=True).start()
            client = HarnessClient(f"grpc://127.0.0.1:{server.port}")
            try:
                yield Env(client, bootstrap, pg_dsn, root, ice, props)
            finally:
                client.close()
                server.shutdown()
                catalog.close()


@contextlib.contextmanager
def _scratch_database() -> Iterator[str]:
    db = f"harness_example_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{db}"')
    try:
        yield PG_ADMIN.rpartition("/")[0] + "/" + db
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
