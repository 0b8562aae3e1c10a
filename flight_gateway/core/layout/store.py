"""The slice store: files the gateway made for pinned versions (DESIGN §17), each written once.

Everything in it is an *artifact*: an immutable set of files under one key (a hot source's
piece as Parquet, a manifest, a table's metadata). Artifacts are keyed by content identity and
by the catalog's table id (an incarnation: a table dropped and created again never finds the
dropped one's files). A version *uses* artifacts; an artifact is swept when no kept version of
its table uses it and nothing pins it: a version being laid out, or one an engine was handed
(pinned for ``pin_s`` after each load: an engine reads the files after the load returns).

Files are written under a temporary name in the artifact's directory and renamed into place
whole, then recorded in the index (SQLite, WAL) in one transaction with the version's use, so
a crash leaves either nothing or a temporary file (removed at start). Directories are 0700 and
files 0600 unless the operator makes them group-readable for an engine running as another user.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flight_gateway.protocol.errors import ResourceExhausted

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (
    key TEXT PRIMARY KEY, table_id INTEGER NOT NULL, family TEXT NOT NULL,
    state TEXT, files TEXT NOT NULL, bytes INTEGER NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS artifacts_family ON artifacts (table_id, family);
CREATE TABLE IF NOT EXISTS uses (
    table_id INTEGER NOT NULL, version INTEGER NOT NULL, key TEXT NOT NULL,
    PRIMARY KEY (table_id, version, key));
CREATE INDEX IF NOT EXISTS uses_key ON uses (key);
CREATE TABLE IF NOT EXISTS tables (table_id INTEGER PRIMARY KEY, name TEXT NOT NULL);
"""


@dataclass(frozen=True)
class StoredFile:
    path: str  # absolute local path
    size: int
    rows: int


@dataclass(frozen=True)
class Artifact:
    key: str
    files: tuple[StoredFile, ...]
    state: Any = None


class SliceStore:
    def __init__(
        self, root: Path, *, budget_bytes: int | None = None, pin_s: float = 3600.0,
        group_readable: bool = False,
    ) -> None:  # fmt: skip
        self.root = root
        self.budget_bytes = budget_bytes
        self.pin_s = pin_s
        self.dir_mode, self.file_mode = (0o750, 0o640) if group_readable else (0o700, 0o600)
        self._mkdir(root)
        os.chmod(root, self.dir_mode)
        self._db = sqlite3.connect(root / "index.db", check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        os.chmod(root / "index.db", self.file_mode)
        self._lock = threading.RLock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._pins: dict[tuple[int, int], float] = {}  # (table id, version) -> until (monotonic)
        # Uses already recorded: a repeated load of a version writes (and syncs) nothing.
        self._recorded: set[tuple[int, int, str]] = set()
        self._holds: dict[tuple[int, int], int] = {}
        self._writing: dict[int, int] = {}  # id of a write in progress -> its bytes so far
        self._remove_partials()

    # ------------------------------------------------------------------ files

    def _mkdir(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True, mode=self.dir_mode)

    def directory(self, table_id: int, family: str) -> Path:
        d = self.root / f"t{table_id}" / family
        if not d.is_dir():
            self._mkdir(d)
            for p in (d, d.parent):
                os.chmod(p, self.dir_mode)
        return d

    def temporary(self, table_id: int, family: str, suffix: str) -> Path:
        """A fresh temporary path in the family's directory; ``publish`` renames it."""
        return self.directory(table_id, family) / f".tmp-{uuid.uuid4().hex}{suffix}"

    def publish(self, tmp: Path, final: Path) -> None:
        os.chmod(tmp, self.file_mode)
        os.replace(tmp, final)

    def _remove_partials(self) -> None:
        for tmp in self.root.glob("t*/*/.tmp-*"):
            tmp.unlink(missing_ok=True)

    # ------------------------------------------------------------------ index

    @contextmanager
    def making(self, key: str) -> Iterator[None]:
        """Held while ``key`` is being made: two versions that share a piece write it once."""
        with self._lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            yield

    def get(self, key: str) -> Artifact | None:
        with self._lock:
            row = self._db.execute(
                "SELECT files, state FROM artifacts WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            return None
        files = tuple(StoredFile(**f) for f in json.loads(row[0]))
        if not all(os.path.exists(f.path) for f in files):
            return None  # removed behind our back: made again
        return Artifact(key, files, json.loads(row[1]) if row[1] else None)

    def states(self, table_id: int, family: str) -> list[Any]:
        """The states of the artifacts of one family (a source's pieces), to reuse."""
        with self._lock:
            rows = self._db.execute(
                "SELECT state FROM artifacts WHERE table_id = ? AND family = ? AND state IS NOT NULL",
                (table_id, family),
            ).fetchall()
        return [json.loads(r[0]) for r in rows]

    def put(
        self, key: str, table_id: int, family: str, files: Sequence[StoredFile], state: Any = None
    ) -> Artifact:
        total = sum(f.size for f in files)
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO artifacts VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, table_id, family, json.dumps(state) if state is not None else None,
                 json.dumps([f.__dict__ for f in files]), total, time.time()),
            )  # fmt: skip
            self._db.commit()
        return Artifact(key, tuple(files), state)

    def use(self, table_id: int, table: str, version: int, keys: Sequence[str]) -> None:
        with self._lock:
            new = [
                (table_id, version, k) for k in keys if (table_id, version, k) not in self._recorded
            ]
            if not new:
                return
            self._db.execute("INSERT OR REPLACE INTO tables VALUES (?, ?)", (table_id, table))
            self._db.executemany("INSERT OR IGNORE INTO uses VALUES (?, ?, ?)", new)
            self._db.commit()
            self._recorded.update(new)

    def used_bytes(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM artifacts").fetchone()
        return int(row[0])

    # ------------------------------------------------------------------ budget

    def check_budget(
        self, adding: int, sweep: Callable[[], Any], writer: object | None = None,
        what: str = "a slice",
    ) -> None:  # fmt: skip
        """RESOURCE_EXHAUSTED when ``adding`` more bytes would pass the budget even after a
        sweep of what no kept version uses, counting what other writes have on disk so far.
        ``writer``: a write in progress whose ``adding`` bytes so far are then counted for the
        others until ``done_writing``."""
        budget = self.budget_bytes
        if budget is None:
            return
        if adding > budget:  # no sweep makes room: a retry fails the same way
            raise ResourceExhausted(
                f"{what} of {adding / 2**20:.1f} MB or more does not fit the slice store's "
                f"budget of {budget / 2**20:.1f} MB: raise iceberg_rest.disk_budget_mb"
            )
        if self.used_bytes() + self._others(writer) + adding > budget:
            sweep()
            used, others = self.used_bytes(), self._others(writer)
            if used + others + adding > budget:
                raise ResourceExhausted(
                    f"the slice store is full ({used / 2**20:.0f} MB of its "
                    f"{budget / 2**20:.0f} MB budget in use by kept versions, "
                    f"{others / 2**20:.0f} MB being written): try again after older versions "
                    "expire, or raise iceberg_rest.disk_budget_mb"
                )
        if writer is not None:
            with self._lock:
                self._writing[id(writer)] = adding

    def _others(self, writer: object | None) -> int:
        with self._lock:
            return sum(n for k, n in self._writing.items() if k != id(writer))

    def done_writing(self, writer: object) -> None:
        """``writer``'s bytes are no more in progress (published, or removed)."""
        with self._lock:
            self._writing.pop(id(writer), None)

    # ------------------------------------------------------------------ pins

    def pin(self, table_id: int, version: int, seconds: float | None = None) -> None:
        """Keep ``version``'s artifacts for ``seconds`` (an engine was handed its files)."""
        until = time.monotonic() + (self.pin_s if seconds is None else seconds)
        with self._lock:
            key = (table_id, version)
            self._pins[key] = max(self._pins.get(key, 0.0), until)

    @contextmanager
    def hold(self, table_id: int, version: int) -> Iterator[None]:
        """Keep ``version``'s artifacts while the block runs (a layout or a read in progress)."""
        key = (table_id, version)
        with self._lock:
            self._holds[key] = self._holds.get(key, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._holds[key] -= 1
                if not self._holds[key]:
                    del self._holds[key]

    def _pinned(self) -> set[tuple[int, int]]:
        now = time.monotonic()
        with self._lock:
            for k in [k for k, until in self._pins.items() if until <= now]:
                del self._pins[k]
            return set(self._pins) | set(self._holds)

    # ------------------------------------------------------------------ sweep

    def sweep(self, kept: Callable[[int, str], Callable[[int], bool]]) -> dict[str, int]:
        """Remove what no kept version uses and nothing pins. ``kept(table_id, name)`` returns
        a test of which versions of that table incarnation are kept (none when it was dropped)."""
        pinned = self._pinned()
        with self._lock:
            tables = self._db.execute("SELECT table_id, name FROM tables").fetchall()
            uses = self._db.execute("SELECT DISTINCT table_id, version FROM uses").fetchall()
        tests = {tid: kept(tid, name) for tid, name in tables}
        dead = [
            (tid, v) for tid, v in uses
            if (tid, v) not in pinned and not tests.get(tid, lambda _v: False)(v)
        ]  # fmt: skip
        with self._lock:
            self._db.executemany("DELETE FROM uses WHERE table_id = ? AND version = ?", dead)
            ended = set(dead)
            self._recorded = {u for u in self._recorded if (u[0], u[1]) not in ended}
            # Unused artifacts; one made but not yet used is held by its version's layout.
            held = {tid for tid, _ in pinned}
            orphans = self._db.execute(
                "SELECT key, table_id, files FROM artifacts a WHERE NOT EXISTS "
                "(SELECT 1 FROM uses u WHERE u.key = a.key)"
            ).fetchall()
            gone = [(k, json.loads(f)) for k, tid, f in orphans if tid not in held]
            self._db.executemany("DELETE FROM artifacts WHERE key = ?", [(k,) for k, _ in gone])
            self._db.execute(
                "DELETE FROM tables WHERE table_id NOT IN (SELECT DISTINCT table_id FROM uses) "
                "AND table_id NOT IN (SELECT DISTINCT table_id FROM artifacts)"
            )
            self._db.commit()
        removed = 0
        for _, files in gone:
            for f in files:
                removed += f["size"]
                Path(f["path"]).unlink(missing_ok=True)
        with self._lock:
            alive = {r[0] for r in self._db.execute("SELECT DISTINCT table_id FROM artifacts")}
        for tid, _ in tables:
            if tid not in alive and tid not in held:
                shutil.rmtree(self.root / f"t{tid}", ignore_errors=True)
        if gone:
            log.info("slice store: swept %d artifacts (%d MB)", len(gone), removed >> 20)
        return {"versions": len(dead), "artifacts": len(gone), "bytes": removed}

    def close(self) -> None:
        with self._lock:
            self._db.close()
