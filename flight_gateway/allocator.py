"""glibc malloc settings for processes that move Arrow data over Flight.

gRPC keeps message bytes in glibc ``malloc`` memory (the receive slices, and the contiguous copy
a multi-slice message is gathered into before the IPC reader sees it). A 1-2 MiB message is
above glibc's default ``mmap`` threshold, and the thread arenas shrink their heaps as soon as
the top is free: every message maps, faults in (the kernel zeroes each page) and unmaps fresh
memory. Reading 16 M rows (512 MB) over loopback spent a quarter of its CPU time there
(``perf``: ``clear_page_erms``, ``mprotect``/``madvise`` of arena heaps). Serving allocations
up to 4 MiB from the arenas and keeping up to 64 MiB free at an arena's top removes most of
it (10-25 % less CPU per 16 M-row read over loopback, docs/operations.md).

Process-wide, once; skipped where it cannot apply (not glibc) or where the process already
tunes malloc (``GLIBC_TUNABLES``, ``MALLOC_*_`` variables), or with
``HARNESS_MALLOC_TUNING=0``. The gateway applies it by default; a client process (which may be
any application) only with ``HARNESS_MALLOC_TUNING=1``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_done = False


def _tuned_elsewhere(default_on: bool) -> bool:
    setting = os.environ.get("HARNESS_MALLOC_TUNING", "1" if default_on else "0")
    if setting.strip().lower() in ("0", "false", "no"):
        return True
    if "malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return True
    return any(k.startswith("MALLOC_") and k.endswith("_") for k in os.environ)


def tune_for_flight(default_on: bool = True) -> bool:
    """Apply the settings above once per process; True when they are in effect.
    ``default_on=False``: only when ``HARNESS_MALLOC_TUNING=1`` asks for it."""
    global _done
    with _lock:
        if _done:
            return True
        if not sys.platform.startswith("linux") or _tuned_elsewhere(default_on):
            return False
        try:
            libc = ctypes.CDLL(None)
            if not hasattr(libc, "gnu_get_libc_version"):
                return False  # musl and others: mallopt means something else or nothing
            ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            ok = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
        except (OSError, AttributeError):
            return False
        _done = ok
        if not ok:
            log.debug("mallopt refused the Flight allocator settings")
        return ok
