"""What the reader, the stream reader and the writer share: options and endpoint partitions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition


def client(options: dict[str, str]) -> Any:
    from clients import HarnessClient

    uris = [u.strip() for u in (options.get("uri") or "").split(",") if u.strip()]
    if not uris:
        raise ValueError("harness-flight needs option 'uri' (grpc://host:port[,replica,...])")
    # Replicas after the first: safe calls move to another one when a gateway dies.
    return HarnessClient(
        uris[0],
        token=options.get("token") or None,
        replicas=uris[1:],
        traceparent=options.get("traceparent") or None,
    )


def read_args(options: dict[str, str], extra_filters: list[str] | None = None) -> dict[str, Any]:
    """Client read arguments from data source options (the same names as the client's)."""
    table = options.get("table")
    if not table:
        raise ValueError("harness-flight needs option 'table'")
    columns = [c.strip() for c in options["columns"].split(",")] if options.get("columns") else None
    filters = [f"({options['filter']})"] if options.get("filter") else []
    filters += [f"({f})" for f in extra_filters or []]
    args: dict[str, Any] = {"columns": columns, "filter": " AND ".join(filters) or None}
    if options.get("version"):
        args["version"] = int(options["version"])
    if options.get("as_of"):
        args["as_of"] = options["as_of"]
    if str(options.get("dedupe", "false")).lower() == "true":
        args["dedupe"] = True
    if options.get("sources"):
        args["sources"] = [s.strip() for s in options["sources"].split(",")]
    return args


@dataclass
class EndpointPartition(InputPartition):
    """One Flight endpoint: a signed ticket pinned to the version planned on the driver."""

    ticket: bytes
    locations: list[str]
    version: int


def partitions_of(info: Any, version: int) -> list[InputPartition]:
    """One Spark partition per endpoint of a FlightInfo."""
    parts: list[InputPartition] = []
    for ep in info.endpoints:
        locs = [
            loc.uri.decode() if isinstance(loc.uri, bytes) else str(loc.uri) for loc in ep.locations
        ]
        parts.append(EndpointPartition(ep.ticket.ticket, locs, version))
    return parts


def given_partitions(options: dict[str, str]) -> list[InputPartition]:
    """Partitions from the ``endpoints`` option: JSON ``[{"ticket": base64, "locations": [...]}]``
    of endpoints planned elsewhere (``spark_datasource.native``), pinned to ``version``."""
    import base64
    import json

    version = int(options.get("version") or 0)
    try:
        listed = json.loads(options["endpoints"])
        return [
            EndpointPartition(base64.b64decode(e["ticket"]), list(e.get("locations", [])), version)
            for e in listed
        ]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"option 'endpoints' is not a list of planned endpoints: {e}") from e
