"""Databases that read DuckLakes, kept between reads.

The first DuckLake ``ATTACH`` in a DuckDB database costs ~130 ms (a SQLite-backed lake; the
extension's one-time set-up in that database), a later one ~2 ms. Every planning and read of a
DuckLake source attached its lake in a new database, so a statement's first plan of a table
paid it for each source. Here a read-only use takes a database that attached a lake before,
attaches its lake afresh (so it sees the metadata as of now) and detaches it when done; the
database goes back for the next use only if nothing was left in it. Writes use a database of
their own (they register Arrow tables and run transactions). ``warm`` makes the first one
ahead (the gateway calls it when it has DuckLake sources), so no read pays the set-up.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

#: Idle databases kept (each a few MB).
IDLE = 4

_idle: list[Any] = []
_lock = threading.Lock()


def take(make: Any) -> Any:
    """An idle database, or a new one from ``make()``."""
    with _lock:
        if _idle:
            return _idle.pop()
    return make()


_warmed = False


def warm(make: Any, attach: str) -> None:
    """One database made ahead and kept idle, past the extensions' first-attach set-up, so
    the process's first read of a lake does not pay it. Once per process. ``attach``
    attaches a lake as ``__warm`` (``DuckLakeKind.warm``: one that writes nothing)."""
    global _warmed
    with _lock:
        done, _warmed = _warmed or bool(_idle), True
    if done:
        return
    db = make()
    try:
        db.execute(attach)
    except Exception:
        with contextlib.suppress(Exception):
            db.close()
        raise
    give_back(db, "__warm")


def give_back(db: Any, alias: str) -> None:
    """Detach ``alias`` and keep ``db`` for the next read; close it if that fails (a result
    still open on it) or enough are kept."""
    try:
        db.execute(f"DETACH {alias}")
        left = db.execute(
            "SELECT count(*) FROM duckdb_databases() WHERE NOT internal AND database_name <> 'memory'"
        ).fetchone()[0]
    except Exception:
        left = None
    if left == 0:
        with _lock:
            if len(_idle) < IDLE:
                _idle.append(db)
                return
    with contextlib.suppress(Exception):
        db.close()


class Pooled:
    """A read-only connection to a lake attached as ``alias``; ``close`` gives it back."""

    def __init__(self, db: Any, alias: str) -> None:
        self._db, self._alias = db, alias

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            give_back(db, self._alias)
