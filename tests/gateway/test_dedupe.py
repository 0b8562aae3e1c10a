"""The primary-key view (dedupe): the latest row per key across sources, tombstones hide keys."""

from __future__ import annotations

import json
import threading
import time
import uuid

import psycopg
import pyarrow as pa
import pytest

from clients import HarnessClient
from pipelines.mover import Mover
from planners.postgres.versioning import enable_versioning, server_now
from tests.gateway.helpers import IcebergFixture
from tests.gateway.kafka_helpers import new_topic, produce

pytestmark = pytest.mark.integration
SCHEMA = [
    {"name": "id", "type": "int64"},
    {"name": "val", "type": "string"},
    {"name": "seq", "type": "int64"},
    {"name": "_deleted", "type": "bool"},
]
ARROW = pa.schema(
    [("id", pa.int64()), ("val", pa.string()), ("seq", pa.int64()), ("_deleted", pa.bool_())]
)


def three_tiers(
    client: HarnessClient, kafka_bootstrap: str, pg_dsn: str, iceberg: IcebergFixture
) -> dict:
    topic = new_topic(kafka_bootstrap)
    pg = f"dd_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{pg}" (id bigint PRIMARY KEY, val text, seq bigint, _deleted boolean)'
        )
        enable_versioning(conn, pg)
        as_of = server_now(conn)
    cold = iceberg.create(f"dd_{uuid.uuid4().hex[:6]}", ARROW)
    client.create_table("t", SCHEMA, primary_key=["id"], properties={"dedupe.order_by": "seq"})
    client.commit(
        "t",
        add_sources=[
            {
                "name": "k0",
                "kind": "kafka",
                "config": {
                    "bootstrap_servers": kafka_bootstrap,
                    "topic": topic,
                    "partition": 0,
                    "key_column": "id",
                },
                "state": {"low": 0, "high": 0},
            },
            {
                "name": "pg",
                "kind": "postgres",
                "config": {"dsn": pg_dsn, "table": pg},
                "state": {"as_of": as_of},
            },
            {
                "name": "cold",
                "kind": "iceberg",
                "config": iceberg.source_config(cold.name()[-1]),
                "state": {"snapshot_id": None},
            },
        ],
    )
    return {"topic": topic, "pg": pg, "cold": cold}


def msg(i: int, val: str, seq: int, deleted: bool = False) -> bytes:
    return json.dumps({"val": val, "seq": seq, "_deleted": deleted}).encode()


def test_latest_row_per_key_across_tiers(
    client: HarnessClient, kafka_bootstrap: str, pg_dsn: str, iceberg: IcebergFixture
) -> None:
    env = three_tiers(client, kafka_bootstrap, pg_dsn, iceberg)
    env["cold"].append(
        pa.table(
            {
                "id": [1, 2, 3, 4],
                "val": ["c1", "c2", "c3", "c4"],
                "seq": [1, 2, 3, 4],
                "_deleted": [False] * 4,
            },
            schema=ARROW,
        )
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO \"{env['pg']}\" VALUES (2, 'p2', 10, false), (3, 'p3', 11, true), (5, 'p5', 12, false)"
        )
        as_of = server_now(conn)
    # Kafka: key 1 updated twice (later offset wins), key 4 deleted with a null value.
    offs = produce(
        kafka_bootstrap,
        env["topic"],
        [msg(1, "k1a", 20), msg(1, "k1b", 21), None],
        keys=[b"1", b"1", b"4"],
    )
    client.commit(
        "t",
        updates=[
            {
                "source": "cold",
                "state": {"snapshot_id": env["cold"].current_snapshot().snapshot_id},
            },
            {"source": "pg", "state": {"as_of": as_of}},
            {"source": "k0", "state": {"low": 0, "high": offs[-1] + 1}},
        ],
    )
    view = client.read("t", dedupe=True).sort_by("id").to_pylist()
    assert [(r["id"], r["val"]) for r in view] == [(1, "k1b"), (2, "p2"), (5, "p5")]
    assert len(client.read("t")) == 10  # the union view still has every row
    # The filter applies to the latest row: key 2's older 'c2' must not resurface.
    assert client.read("t", dedupe=True, filter="val = 'c2'").num_rows == 0
    assert client.read("t", dedupe=True, filter="id = 2", columns=["val"]).to_pylist() == [
        {"val": "p2"}
    ]


def test_dedupe_needs_a_primary_key(client: HarnessClient) -> None:
    from flight_gateway.protocol.errors import InvalidArgument

    client.create_table("nokey", [{"name": "a", "type": "int64"}])
    with pytest.raises(InvalidArgument, match="primary_key"):
        client.read("nokey", dedupe=True)


def test_dedupe_planned_per_partition_when_co_partitioned(client: HarnessClient, tmp_path) -> None:
    import pyarrow.parquet as pq

    client.create_table(
        "p",
        [
            {"name": "region", "type": "string"},
            {"name": "id", "type": "int64"},
            {"name": "v", "type": "int64"},
        ],
        primary_key=["region", "id"],
        partition_by=["region"],
    )
    adds = []
    for region in ("eu", "us"):
        for i, name in enumerate(("old", "new")):
            pq.write_table(
                pa.table({"region": [region] * 2, "id": [1, 2], "v": [i, i]}),
                tmp_path / f"{region}-{name}.parquet",
            )
        adds.append(
            {
                "name": region,
                "kind": "files",
                "partition": {"region": region},
                "config": {"root": str(tmp_path)},
                "state": {"files": [f"{region}-old.parquet", f"{region}-new.parquet"]},
            }
        )
    client.commit("p", add_sources=adds)
    assert len(client.flight_info("p", dedupe=True).endpoints) == 2
    assert client.read("p", dedupe=True).column("v").to_pylist() == [1, 1, 1, 1]  # later file wins
    assert len(client.flight_info("p", dedupe=True, filter="region = 'eu'").endpoints) == 1


@pytest.mark.slow
def test_dedupe_exact_while_movers_run(
    client: HarnessClient, kafka_bootstrap: str, pg_dsn: str, iceberg: IcebergFixture
) -> None:
    env = three_tiers(client, kafka_bootstrap, pg_dsn, iceberg)
    produced: list[tuple[int, int, int, bool]] = []  # (offset, key, seq, deleted)
    stop = threading.Event()
    errors: list[BaseException] = []
    seq = [0]

    def loop(body):
        def run() -> None:
            try:
                while not stop.is_set():
                    body()
            except BaseException as e:
                errors.append(e)
                stop.set()

        t = threading.Thread(target=run)
        t.start()
        return t

    def producer() -> None:
        rows = []
        for _ in range(10):
            seq[0] += 1
            key = seq[0] % 7
            rows.append((key, seq[0], seq[0] % 5 == 0))
        offs = produce(
            kafka_bootstrap,
            env["topic"],
            [msg(k, f"v{s}", s, d) for k, s, d in rows],
            keys=[str(k).encode() for k, _, _ in rows],
        )
        produced.extend((o, k, s, d) for o, (k, s, d) in zip(offs, rows, strict=True))
        with client.lock("t", ["k0"], owner="ingester", ttl_s=30, wait_s=30) as lock:
            low = client.describe("t").source("k0").state["low"]
            client.commit(
                "t",
                lock=lock,
                updates=[{"source": "k0", "state": {"low": low, "high": offs[-1] + 1}}],
            )
        time.sleep(0.05)

    to_pg = Mover(client, "t", "k0", "pg", wait_s=30)
    to_cold = Mover(client, "t", "pg", "cold", wait_s=30)
    checks = [0]

    def reader() -> None:
        info = client.flight_info("t", dedupe=True)
        v = client.pinned_version(info)
        high = client.describe("t", version=v).source("k0").state["high"]
        latest: dict[int, tuple[int, bool]] = {}
        for off, key, s, deleted in list(produced):
            if off < high and (key not in latest or s > latest[key][0]):
                latest[key] = (s, deleted)
        expected = sorted((k, f"v{s}") for k, (s, d) in latest.items() if not d)
        got = sorted(
            (r["id"], r["val"])
            for r in client.read("t", version=v, dedupe=True, columns=["id", "val"]).to_pylist()
        )
        assert got == expected, f"version {v}"
        checks[0] += 1

    threads = [
        loop(producer),
        loop(lambda: (to_pg.run_once(), time.sleep(0.1))),
        loop(lambda: (to_cold.run_once(), time.sleep(0.3))),
        loop(reader),
    ]
    stop.wait(8)
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert checks[0] >= 3
