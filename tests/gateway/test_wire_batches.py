"""DoGet sends batches as IPC messages under 2 MiB of body (they then arrive 8-byte aligned and
the client's IPC reader does not copy them again; see ``WIRE_BATCH_BYTES``), without changing
the rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from clients import HarnessClient
from flight_gateway.faces.flight.errors import WIRE_BATCH_BYTES, wire_sized
from tests.gateway.helpers import write_parquet

N = 65_536 * 3


def _wide(n: int) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "a": rng.integers(0, 1_000_000, n),
            "b": rng.integers(0, 1_000_000, n),
            "c": rng.random(n),
        }
    )


def test_wire_sized_slices_big_batches_and_keeps_rows() -> None:
    batch = _wide(65_536).to_batches()[0]  # exactly 2 MiB: would arrive at 1 mod 8
    assert batch.nbytes == 2 << 20
    pieces = list(wire_sized(batch))
    assert len(pieces) == 2
    assert all(p.nbytes <= WIRE_BATCH_BYTES for p in pieces)
    assert pa.Table.from_batches(pieces).equals(pa.Table.from_batches([batch]))
    small = _wide(1000).to_batches()[0]
    assert list(wire_sized(small)) == [small]


def test_wire_sized_keeps_pieces_of_a_dictionary_batch_reasonable() -> None:
    # the dictionary counts in every slice's nbytes: no flood of tiny batches
    values = pa.array([f"value-{i:08d}" * 4 for i in range(100_000)])
    batch = pa.record_batch({"d": pa.DictionaryArray.from_arrays(pa.array([0, 1] * 2048), values)})
    pieces = list(wire_sized(batch))
    assert all(p.num_rows >= 1024 for p in pieces)
    assert sum(p.num_rows for p in pieces) == batch.num_rows


def test_doget_messages_stay_under_2_mib(gateway, client: HarnessClient, tmp_path: Path) -> None:
    server, _ = gateway
    data = _wide(N)
    write_parquet(tmp_path / "f" / "a.parquet", data)
    client.create_table("t", [{"name": f.name, "type": str(f.type)} for f in data.schema])
    client.add_source(
        "t", "f", "files", config={"root": str(tmp_path / "f")}, state={"files": ["a.parquet"]}
    )
    raw = fl.connect(f"grpc://127.0.0.1:{server.port}")
    try:
        info = raw.get_flight_info(fl.FlightDescriptor.for_path("t"))
        batches = [chunk.data for ep in info.endpoints for chunk in raw.do_get(ep.ticket)]
    finally:
        raw.close()
    assert max(b.nbytes for b in batches) < 2 << 20
    assert pa.Table.from_batches(batches).sort_by("id").equals(data)
    assert client.read("t").sort_by("id").equals(data)
