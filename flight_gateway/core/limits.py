"""Bounds on what one call may cost (the gateway config's ``limits``): sizes, counts, waits,
concurrency, and what one SQL statement may use (``SqlLimits``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SqlLimits:
    """Per-statement bounds (``limits.sql_*`` in the gateway config)."""

    memory_limit_mb: int = 1024
    threads: int = 0  # 0: one per core
    timeout_s: float = 300.0
    spill_limit_mb: int = 10 * 1024
    temp_dir: str | None = None  # None: the system's temporary directory
    #: Results of deterministic statements kept for statements over the same pinned versions
    #: (0: none kept); one result is kept only if at most an eighth of this.
    result_cache_mb: int = 64
    #: How long a statement started at GetFlightInfo waits for its DoGet (0: started at DoGet).
    early_start_s: float = 2.0

    @property
    def hard_limit_mb(self) -> int:
        """What one statement may allocate in all, past its worker's own size: DuckDB's buffers
        (``memory_limit_mb``, spilling past it) and a quarter more, at least 192 MB, for what
        DuckDB does not count (strings computed in expressions, result batches on their way
        out, its allocator's arenas and buffers while it spills). A result of 300,000 short
        rows streamed out needed more than 64 MB at 64 MB for DuckDB and 64 in all; a hash
        join of 3 M strings spilling at 256 MB grew a fresh process's data segment by 330-420
        MB (1-4 threads), so 64 MB more failed every statement that had to spill there."""
        return int(self.memory_limit_mb) + max(192, int(self.memory_limit_mb) // 4)


@dataclass(frozen=True)
class Limits:
    """Bounds on what one call may cost: INVALID_ARGUMENT beyond most of them, RESOURCE_EXHAUSTED
    beyond the upload and concurrency ones (docs/security.md, "Limits" and "DoPut")."""

    #: Decoded Arrow bytes of one DoPut, checked as each batch is decoded.
    max_upload_bytes: int = 1 << 30
    max_tasks: int = 10_000
    max_lock_wait_s: float = 300.0
    #: Lease of the locks the gateway takes for a DoPut or an engine write, renewed every
    #: third of it while the write runs: after a gateway dies mid-write, its sources are
    #: free again this long after.
    write_lease_s: float = 10.0
    max_streams_per_principal: int = 64
    #: DoPut calls one principal may have in progress at once.
    max_uploads_per_principal: int = 4
    #: DoPut calls the whole gateway decodes and holds at once (all principals).
    max_concurrent_uploads: int = 8
    #: What kinds that hold resources for the whole process may hold (``HoldsResources``):
    #: ``{"kafka": {"max_consumers": 0, "consumer_wait_s": 60}}``.
    kinds: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    max_dedupe_rows: int = 20_000_000
    max_since_versions: int = 100_000
    #: Flight SQL statements the whole gateway runs at once (each also holds one of its
    #: caller's ``max_streams_per_principal``).
    max_concurrent_statements: int = 4
    #: DuckDB memory of one statement; past it DuckDB spills to ``sql_temp_dir``.
    sql_memory_limit_mb: int = 1024
    #: Disk one statement may spill to.
    sql_spill_limit_mb: int = 10 * 1024
    #: DuckDB threads per statement (0: one per core).
    sql_threads: int = 0
    #: A statement running longer is interrupted (DEADLINE_EXCEEDED).
    sql_timeout_s: float = 300.0
    #: Where statements spill (a directory per statement, removed when it ends); None: the
    #: system's temporary directory.
    sql_temp_dir: str | None = None
    #: Results of deterministic statements the gateway keeps for statements over the same
    #: pinned table versions (a pinned version never changes); 0 keeps none.
    sql_result_cache_mb: int = 64
    #: A statement is started at GetFlightInfo when a worker is idle, and stopped if no DoGet
    #: takes it within this long (docs/protocol.md, "Started at GetFlightInfo"); 0: at DoGet.
    sql_early_start_s: float = 2.0

    def __post_init__(self) -> None:
        for name in (
            "max_uploads_per_principal",
            "max_concurrent_uploads",
            "max_concurrent_statements",
            "sql_memory_limit_mb",
            "sql_spill_limit_mb",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"limits.{name} must be a positive integer, not {value!r}")
        for name in ("sql_threads", "sql_result_cache_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"limits.{name} must be 0 or more, not {value!r}")
        if not isinstance(self.kinds, Mapping) or not all(
            isinstance(v, Mapping) for v in self.kinds.values()
        ):
            raise ValueError("limits.kinds must map kind names to their settings")
        for name in ("sql_timeout_s", "write_lease_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"limits.{name} must be positive, not {value!r}")
        value = self.sql_early_start_s
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise ValueError(f"limits.sql_early_start_s must be 0 or more, not {value!r}")

    def sql(self) -> SqlLimits:
        """The per-statement limits of Flight SQL."""
        return SqlLimits(
            memory_limit_mb=self.sql_memory_limit_mb,
            threads=self.sql_threads,
            timeout_s=float(self.sql_timeout_s),
            spill_limit_mb=self.sql_spill_limit_mb,
            temp_dir=self.sql_temp_dir,
            result_cache_mb=self.sql_result_cache_mb,
            early_start_s=float(self.sql_early_start_s),
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Limits:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown limits {unknown} (known: {sorted(known)})")
        return cls(**d)
