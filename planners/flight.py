"""``flight`` sources: proxy another Arrow Flight server; its endpoints become ours.

Config: ``location`` (``grpc://host:port``), ``descriptor`` (``{"command": str}`` or
``{"path": [..]}``), optional ``token`` (use ``${ENV}``). State is opaque to the harness; when it
holds a ``descriptor`` that one is used, so a commit can pin what the upstream serves.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from flight_gateway.protocol.errors import InvalidArgument, Unavailable
from planners import locations
from planners.common import closing, conform, physical_names
from planners.kind import Reach, ScanRequest, ScanTask, SourceConfig, SourceKind, SourceRef


@dataclass(frozen=True, kw_only=True)
class FlightConfig(SourceConfig):
    location: str
    descriptor: dict[str, Any] | None = None
    token: str | None = None
    timeout_s: float = 60.0


def _descriptor(src_config: Mapping[str, Any], state: Mapping[str, Any]) -> fl.FlightDescriptor:
    d = state.get("descriptor") or src_config.get("descriptor")
    if isinstance(d, Mapping) and isinstance(d.get("command"), str):
        return fl.FlightDescriptor.for_command(d["command"].encode())
    if isinstance(d, Mapping) and isinstance(d.get("path"), list):
        return fl.FlightDescriptor.for_path(*[str(p) for p in d["path"]])
    raise InvalidArgument("flight source needs descriptor {'command': str} or {'path': [...]}")


#: Flight bodies arrive zero-copy at unaligned offsets; realign (copying only misaligned
#: buffers) while decoding, before residual filters run them through Acero.
_READ_OPTIONS = pa.ipc.IpcReadOptions(ensure_alignment=pa.ipc.Alignment.DataTypeSpecific)


def _options(config: Mapping[str, Any]) -> fl.FlightCallOptions:
    token = config.get("token")
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return fl.FlightCallOptions(
        headers=headers, timeout=float(config.get("timeout_s", 60)), read_options=_READ_OPTIONS
    )


class FlightKind(SourceKind):
    config_model = FlightConfig

    def reaches(self, source: SourceRef) -> list[Reach]:
        # Upstream endpoints may name other locations: those are checked when read.
        return [locations.service_uri("location", self.parse_config(source).location)]

    def plan(self, request: ScanRequest) -> list[ScanTask]:
        src = request.source
        location = self.parse_config(src).location
        try:
            with fl.connect(location) as client:
                info = client.get_flight_info(
                    _descriptor(src.config, src.state), _options(src.config)
                )
        except fl.FlightUnavailableError as e:
            raise Unavailable(f"source {src.name!r}: upstream {location} unreachable: {e}") from e
        tasks = []
        for ep in info.endpoints:
            locs = [
                loc.uri.decode() if isinstance(loc.uri, bytes) else str(loc.uri)
                for loc in ep.locations
            ]
            tasks.append(
                ScanTask(
                    src.name,
                    {"ticket": base64.b64encode(ep.ticket.ticket).decode(), "locations": locs},
                )
            )
        return tasks

    def read(self, request: ScanRequest, task: ScanTask) -> pa.RecordBatchReader:
        src = request.source
        # Always the configured (allow-listed) location: an upstream's endpoint locations could
        # otherwise send the gateway anywhere.
        location = self.parse_config(src).location
        ticket = fl.Ticket(base64.b64decode(task.payload["ticket"]))
        try:
            client = fl.connect(location)
            stream = client.do_get(ticket, _options(src.config))
            reader = stream.to_reader()
        except fl.FlightUnavailableError as e:
            raise Unavailable(f"source {src.name!r}: upstream {location} unreachable: {e}") from e
        mapping = physical_names(request.columns, reader.schema.names)
        # Keep the upstream connection open until the stream ends.
        return conform(closing(reader, client), request.columns, mapping)
