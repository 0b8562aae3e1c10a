"""The mover: rows of a hot source into a cold one, in one commit, by the gateway's
``harness.move`` (``flight_gateway/core/write/move.py``: one mover over the kinds'
capabilities, run where the secrets and the allow-lists are).

``Mover(client, table, hot, cold).run_once()`` moves what the hot source holds now (Kafka's
``[low, high)``, a PostgreSQL table's rows, optionally only those matching ``where``) and
returns what happened. A move interrupted anywhere (a gateway killed mid-move) is finished by
the next ``run_once`` on the same hot source, with the same rows, before anything new moves;
no row is ever visible twice or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clients import HarnessClient


@dataclass
class MoveResult:
    version: int | None  # None: nothing to move
    rows: int
    resumed: bool = False  # an interrupted move was finished (its rows, not new ones)


class Mover:
    def __init__(
        self,
        client: HarnessClient,
        table: str,
        hot: str,
        cold: str,
        *,
        where: str | None = None,
        mode: str = "auto",
        wait_s: float = 120.0,
    ) -> None:
        self.client, self.table, self.hot, self.cold = client, table, hot, cold
        self.where, self.mode, self.wait_s = where, mode, wait_s

    def run_once(self, **staged: Any) -> MoveResult:
        """One move; ``staged`` (``write_id``, ``paths``, ``version``): an engine wrote the
        rows into the cold source's staging location (``pipelines.spark_jobs``)."""
        out = self.client.move(
            self.table,
            self.hot,
            self.cold,
            where=self.where,
            mode=self.mode,
            staged=staged or None,
            wait_s=self.wait_s,
        )
        version = out.get("version")
        return MoveResult(None if version is None else int(version), int(out.get("rows") or 0),
                          bool(out.get("resumed")))  # fmt: skip
