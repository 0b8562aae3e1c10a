"""Write locks the gateway takes for its own work (DoPut, ``commit_write``): short leases,
renewed in the background while the work runs.

A lease outlives the process that holds it. A long fixed lease made every later write to the
same sources wait for it after a gateway died mid-write (minutes); a short one renewed at a
third of its length frees them within ``write_lease_s`` of the death, while a live writer keeps
its lock for as long as the work takes. Fencing covers the rest: a holder that lost its lease
(a stall longer than the lease) fails its commit with ``LockExpired`` instead of writing over
whoever took the lock next. A process that dies does not even wait for that: its lease watcher
(``catalog.locks.watch``) deletes the leases it held as soon as the process is gone.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from flight_gateway.catalog import Catalog
from flight_gateway.catalog.locks.watch import WATCH
from flight_gateway.catalog.model import LockGrant
from flight_gateway.core import tracing
from flight_gateway.core.metrics import WRITE_LEASE_SECONDS
from flight_gateway.protocol.errors import LockExpired

log = logging.getLogger(__name__)
#: A lease waited for or held longer than this is logged (with what held it: its owner).
SLOW_LEASE_S = 5.0


class _Renewals:
    """One scheduler thread renewing every lease this process holds, each at a third of its
    length, on a few pooled threads (a renewal stalled on its catalog delays no other lease
    while one is free). A thread per lease cost its DoPut a thread start and a join under the
    lease (the start waits for the new thread to run: 0.5-1 ms idle, ~8 % of a DoPut's lease
    samples under 64 readers and 16 writers on 2 cores)."""

    #: Renewals at once: each is one catalog statement; more stalls than this at once mean the
    #: catalog itself is down.
    WORKERS = 4

    def __init__(self) -> None:
        self._cond = threading.Condition()
        #: lock id -> (catalog, ttl_s, when it is due next: monotonic seconds)
        self._held: dict[str, tuple[Catalog, float, float]] = {}
        self._thread: threading.Thread | None = None
        self._renewing: set[str] = set()  # leases being renewed now
        self._pool = ThreadPoolExecutor(self.WORKERS, thread_name_prefix="lease-renewal")

    def add(self, catalog: Catalog, lock_id: str, ttl_s: float) -> None:
        with self._cond:
            self._held[lock_id] = (catalog, ttl_s, time.monotonic() + ttl_s / 3)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lease-renewals",
                                                daemon=True)  # fmt: skip
                self._thread.start()
            self._cond.notify_all()

    def remove(self, lock_id: str) -> None:
        """Stop renewing ``lock_id``; a renewal of it under way finishes first, so none is
        sent after the caller unlocks."""
        with self._cond:
            self._held.pop(lock_id, None)
            while lock_id in self._renewing:
                self._cond.wait()

    def _due(self) -> list[str]:
        # called with the condition held: waits for the next lease due and takes those due
        # (one whose renewal is still under way is not sent again meanwhile)
        while True:
            now = time.monotonic()
            due = [k for k, (_, _, at) in self._held.items() if at <= now]
            for k in due:
                c, t, _ = self._held[k]
                self._held[k] = (c, t, now + t / 3)
            due = [k for k in due if k not in self._renewing]
            if due:
                self._renewing.update(due)
                return due
            nxt = min((at for _, _, at in self._held.values()), default=now + 60.0)
            self._cond.wait(max(0.0, nxt - now))

    def _run(self) -> None:
        while True:
            with self._cond:
                due = self._due()
            for lock_id in due:
                self._pool.submit(self._renew_one, lock_id)

    def _renew_one(self, lock_id: str) -> None:
        expired = False
        try:
            with self._cond:
                held = self._held.get(lock_id)
            if held is not None:  # else released meanwhile
                expired = not self._renew(lock_id, held[0], held[1])
        finally:
            with self._cond:
                self._renewing.discard(lock_id)
                if expired:
                    self._held.pop(lock_id, None)
                self._cond.notify_all()

    @staticmethod
    def _renew(lock_id: str, catalog: Catalog, ttl_s: float) -> bool:
        """False when the lease has expired."""
        try:
            catalog.renew_lock(lock_id, ttl_s)
        except LockExpired:  # the commit will fail with LockExpired too
            log.warning("lease %s expired before its work finished", lock_id)
            return False
        except Exception:  # a catalog hiccup: try again at the next beat
            log.warning("lease %s: renewal failed; retrying", lock_id, exc_info=True)
        return True


_RENEWALS = _Renewals()


@contextmanager
def leased(
    catalog: Catalog,
    table: str,
    sources: Sequence[str],
    *,
    owner: str,
    ttl_s: float,
    wait_s: float,
) -> Iterator[LockGrant]:
    """Hold a lock on ``sources`` for the block, renewing it; released at the end."""
    # The watcher knows the lock's id before the catalog does: a process killed between the
    # grant and telling the watcher would leave a lease nobody frees until it runs out (seen
    # in CI), and a dead process's place in the queue is freed too.
    lock_id = uuid.uuid4().hex
    WATCH.hold(catalog.url, lock_id)
    work = owner.partition(":")[0]
    asked = time.monotonic()
    try:
        with tracing.span("lock.wait", table=table, sources=",".join(sources)):
            grant = catalog.lock(
                table, sources, owner=owner, ttl_s=ttl_s, wait_s=wait_s, lock_id=lock_id
            )
    except BaseException:
        WATCH.release(lock_id)
        raise
    granted = time.monotonic()
    _observe(work, "wait", granted - asked, table, sources, owner)
    _RENEWALS.add(catalog, grant.lock_id, ttl_s)
    try:
        yield grant
    finally:
        with tracing.span("lock.release", table=table):
            _RENEWALS.remove(grant.lock_id)
            catalog.unlock(grant.lock_id)
            WATCH.release(grant.lock_id)
        _observe(work, "held", time.monotonic() - granted, table, sources, owner)


def _observe(
    work: str, stage: str, seconds: float, table: str, sources: Sequence[str], owner: str
) -> None:
    WRITE_LEASE_SECONDS.labels(work, stage).observe(seconds)
    if seconds > SLOW_LEASE_S:
        log.info("lease of %s %s by %s: %s %.1f s", table, ",".join(sources), owner, stage,
                 seconds)  # fmt: skip
