"""``jsonl``: one append-only file of JSON objects, one per line — a complete source kind.

State ``{"lines": n, "bytes": b}``: the first ``n`` lines (``b`` bytes) of the file are the
source's rows at that version. Lines past ``b`` were written by an append whose harness commit
never happened (a crash, a lost reply); they are invisible, and the next append under the
source's lock cuts them off before writing, which makes appends idempotent. Every line carries
the commit id that wrote it (``_commit``), for inspection.

Capabilities: read (projection and a residual filter by the gateway), ``Appendable`` (DoPut and
Spark writes in upload mode) and ``Streams`` (rows added between two states: the lines between
their counts; cumulative, since committed lines never change).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson

from flight_gateway.protocol.errors import InvalidArgument, Unavailable
from planners.common import conform, empty_reader, physical_names
from planners.kind import AppendContext, ScanRequest, ScanTask, SourceConfig, SourceKind

LINES_PER_TASK = 50_000


@dataclass(frozen=True, kw_only=True)
class JsonLinesConfig(SourceConfig):
    path: str


def _state(name: str, state: Mapping[str, Any]) -> tuple[int, int]:
    lines, size = state.get("lines", 0), state.get("bytes", 0)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (lines, size)):
        raise InvalidArgument(f"source {name!r}: state needs 'lines' and 'bytes' >= 0")
    return lines, size


class JsonLinesKind(SourceKind):
    config_model = JsonLinesConfig
    cumulative = True

    def validate_state(self, name: str, state: Mapping[str, Any]) -> None:
        _state(name, state)

    def _tasks(self, name: str, start: int, end: int) -> list[ScanTask]:
        return [
            ScanTask(name, {"start": a, "end": min(a + LINES_PER_TASK, end)})
            for a in range(start, end, LINES_PER_TASK)
        ]

    def plan(self, request: ScanRequest) -> list[ScanTask]:
        lines, _ = _state(request.source.name, request.source.state)
        return self._tasks(request.source.name, 0, lines)

    def plan_added(self, request: ScanRequest, before: Mapping[str, Any] | None) -> list[ScanTask]:
        name = request.source.name
        lines, _ = _state(name, request.source.state)
        start = _state(name, before)[0] if before else 0
        return self._tasks(name, start, lines)

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        config: JsonLinesConfig = self.parse_config(request.source)
        start, end = int(task.payload["start"]), int(task.payload["end"])
        try:
            with open(config.path, "rb") as f:
                chosen = [line for i, line in enumerate(f) if start <= i < end]
        except OSError as e:
            raise Unavailable(f"source {request.source.name!r}: cannot read: {e}") from e
        cols = request.columns
        if not chosen:
            return empty_reader(cols)
        schema = pa.schema([pa.field(c.name, c.arrow_type) for c in cols])
        table = pajson.read_json(
            io.BytesIO(b"".join(chosen)),
            parse_options=pajson.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
        reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
        return conform(reader, cols, physical_names(cols, table.column_names))

    def append(self, ctx: AppendContext, rows: pa.Table) -> dict[str, Any]:
        config: JsonLinesConfig = self.parse_config(ctx.source)
        lines, size = _state(ctx.source.name, ctx.source.state)
        data = b"".join(
            json.dumps({**row, "_commit": ctx.commit_id}, default=str).encode() + b"\n"
            for row in rows.to_pylist()
        )
        os.makedirs(os.path.dirname(os.path.abspath(config.path)), exist_ok=True)
        if os.path.exists(config.path) and os.path.getsize(config.path) < size:
            raise Unavailable(f"source {ctx.source.name!r}: {config.path} lost committed lines")
        with open(config.path, "ab+") as f:
            f.truncate(size)  # drop what uncommitted tries left past the committed end
            f.seek(size)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return {"lines": lines + rows.num_rows, "bytes": size + len(data)}
