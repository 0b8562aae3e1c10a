"""Direct tasks for the endpoints of a plain read (DESIGN.md §10): when the caller asks, the
source's config allows it and its kind can describe the task's files, the endpoint also carries
a signed ``DirectTask`` the client may run itself. Permission was checked when planning."""

from __future__ import annotations

import base64
import logging

import pyarrow as pa

from flight_gateway.core.read.shape import ReadShape
from flight_gateway.protocol.direct import DirectColumn, DirectSigner, DirectTask
from planners.kind import ReadsDirect, ScanRequest, ScanTask, SourceKind
from planners.predicates import columns, to_arrow

log = logging.getLogger(__name__)


def _substrait(shape: ReadShape) -> str | None:
    """The residual filter as Substrait over the task's file columns (``_source`` is a constant,
    not in the files); None when there is none. Raises ValueError when it cannot be evaluated
    on the files alone (the task then stays Flight-only)."""
    if shape.predicate is None:
        return None
    if "_source" in columns(shape.predicate):
        raise ValueError("the filter names _source")
    schema = pa.schema([pa.field(c.name, c.arrow_type) for c in shape.specs if c.name != "_source"])
    try:
        buf = to_arrow(shape.predicate, schema).to_substrait(schema)
    except (pa.ArrowException, TypeError) as e:
        raise ValueError(f"filter has no Substrait form: {e}") from e
    return base64.b64encode(bytes(buf)).decode()


def direct_token(
    signer: DirectSigner,
    kind: SourceKind,
    request: ScanRequest,
    task: ScanTask,
    shape: ReadShape,
    filter_text: str | None,
    table: tuple[str, int],
    principal: str | None,
) -> str | None:
    """A signed direct task for ``task``, or None when it must be read through the gateway."""
    if not isinstance(kind, ReadsDirect) or not kind.parse_config(request.source).direct:
        return None
    files = kind.direct_files(request, task)
    if files is None:
        return None
    request.check_files("data file", files.files)  # whatever the kind lists, before signing
    try:
        substrait = _substrait(shape)
    except ValueError as e:
        log.info("no direct task for %s: %s", request.source.name, e)
        return None
    columns = tuple(
        DirectColumn(c.name, c.type, c.names, files.field_ids.get(c.name))
        for c in shape.specs
        if c.name != "_source"
    )
    constants = (
        {"_source": request.source.name} if any(c.name == "_source" for c in shape.specs) else {}
    )
    direct = DirectTask(
        table=table[0],
        version=table[1],
        source=request.source.name,
        format=files.format,
        files=files.files,
        columns=columns,
        output=tuple(shape.projection),
        filter=filter_text,
        filter_substrait=substrait,
        constants=constants,
        principal=principal,
    )
    return signer.sign(direct)
