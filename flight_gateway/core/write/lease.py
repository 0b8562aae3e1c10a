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


class _Renewer(threading.Thread):
    def __init__(self, catalog: Catalog, lock_id: str, ttl_s: float) -> None:
        super().__init__(daemon=True, name=f"lease-{lock_id[:8]}")
        self.catalog, self.lock_id, self.ttl_s = catalog, lock_id, ttl_s
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.ttl_s / 3):
            try:
                self.catalog.renew_lock(self.lock_id, self.ttl_s)
            except LockExpired:  # the commit will fail with LockExpired too
                log.warning("lease %s expired before its work finished", self.lock_id)
                return
            except Exception:  # a catalog hiccup: try again at the next beat
                log.warning("lease %s: renewal failed; retrying", self.lock_id, exc_info=True)


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
    renewer = _Renewer(catalog, grant.lock_id, ttl_s)
    renewer.start()
    try:
        yield grant
    finally:
        with tracing.span("lock.release", table=table):
            renewer.stop.set()
            renewer.join()
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
