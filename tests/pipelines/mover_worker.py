"""Run one mover pass in its own process (killed by HARNESS_FAULT_INJECT in the tests)."""

from __future__ import annotations

import sys

from clients import HarnessClient
from pipelines.movers import (
    KafkaToIcebergMover,
    KafkaToPostgresMover,
    PostgresToDuckLakeMover,
    PostgresToIcebergMover,
)

MOVERS = {
    "kafka-iceberg": KafkaToIcebergMover,
    "kafka-postgres": KafkaToPostgresMover,
    "postgres-iceberg": PostgresToIcebergMover,
    "postgres-ducklake": PostgresToDuckLakeMover,
}

if __name__ == "__main__":
    uri, kind, table, hot, cold = sys.argv[1:6]
    with HarnessClient(uri) as client:
        MOVERS[kind](
            client, table, hot, cold, owner=f"worker-{kind}", ttl_s=3.0, wait_s=30
        ).run_once()
