"""Harness catalog: which sources make up a table and their state at every table version.

Depends on SQLAlchemy only (and the shared ``flight_gateway.protocol.errors``/``arrow_types`` leaves).
"""

from flight_gateway.catalog.catalog import Catalog
from flight_gateway.catalog.model import (
    CommitInfo,
    CommitResult,
    LockGrant,
    LockInfo,
    SourceSnapshot,
    SourceSpec,
    SourceUpdate,
    TableHead,
    TableSnapshot,
)
from flight_gateway.catalog.schema import Field, Schema

__all__ = [
    "Catalog",
    "CommitInfo",
    "CommitResult",
    "Field",
    "LockGrant",
    "LockInfo",
    "Schema",
    "SourceSnapshot",
    "SourceSpec",
    "SourceUpdate",
    "TableHead",
    "TableSnapshot",
]
