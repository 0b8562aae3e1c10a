"""``scan_harness``: a lazy Polars frame over a harness table, with projection, predicate and
limit pushed into the gateway where Polars allows, and exact results either way."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from clients import HarnessClient
from clients.polars_scan import scan_harness, to_filter


def test_lazy_frame_matches_the_gateway_read(client: HarnessClient, tmp_path: Path) -> None:
    client.create_table(
        "t",
        [
            {"name": "id", "type": "int64"},
            {"name": "region", "type": "string"},
            {"name": "x", "type": "float64"},
        ],
        partition_by=["region"],
    )
    for region, ids in (("eu", range(0, 50)), ("us", range(50, 80))):
        rows = pa.table(
            {
                "id": list(ids),
                "region": [region] * len(ids),
                "x": [None if i % 9 == 0 else i / 2 for i in ids],
            }
        )
        pq.write_table(rows, tmp_path / f"{region}.parquet")
        client.add_source(
            "t",
            region,
            "files",
            partition={"region": region},
            config={"root": str(tmp_path)},
            state={"files": [f"{region}.parquet"]},
        )
    lazy = scan_harness(client, "t")
    pinned = client.describe("t").version
    files = client.describe("t").source("eu").state["files"]
    client.commit("t", updates=[{"source": "eu", "state": {"files": files[:0]}}])  # moves on

    got = (
        lazy.filter((pl.col("region") == "eu") & (pl.col("x") > 10) & pl.col("x").is_not_null())
        .select(["id", "x"])
        .sort("id")
        .collect()
    )
    want = client.read(
        "t",
        version=pinned,
        columns=["id", "x"],
        filter="region = 'eu' AND x > 10 AND x IS NOT NULL",
    ).sort_by("id")
    assert got.to_arrow().to_pylist() == want.to_pylist() and len(want) > 0
    # A predicate the gateway cannot take (a function of two columns) still filters exactly.
    odd = lazy.filter((pl.col("id") % 2) == 1).select("id").collect()
    assert sorted(odd["id"].to_list()) == list(range(1, 80, 2))
    assert lazy.select("id").head(5).collect().height == 5


def test_predicate_translation() -> None:
    expr = (
        (pl.col("a") >= 3) & (pl.col("b") == "it's") & pl.col("c").is_null() & (pl.col("d") + 1 > 2)
    )
    assert to_filter(expr) == '("a" >= 3) AND ("b" = \'it\'\'s\') AND ("c" IS NULL)'
    assert to_filter(None) is None


def test_chdb_over_pinned_reads(client: HarnessClient, tmp_path: Path) -> None:
    from clients.engines import chdb_query

    client.create_table("o", [{"name": "id", "type": "int64"}, {"name": "level", "type": "string"}])
    pq.write_table(
        pa.table({"id": [1, 2, 3, 4], "level": ["a", "b", "a", "a"]}), tmp_path / "o.parquet"
    )
    client.add_source(
        "o", "f", "files", config={"root": str(tmp_path)}, state={"files": ["o.parquet"]}
    )
    got = chdb_query(
        client,
        "SELECT level, count() AS n FROM __o__ GROUP BY level ORDER BY level",
        {"o": "o"},
        reads={"o": {"columns": ["level"]}},
    )
    assert got.to_pylist() == [{"level": "a", "n": 3}, {"level": "b", "n": 1}]
