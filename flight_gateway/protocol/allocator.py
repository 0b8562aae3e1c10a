"""glibc malloc settings for processes that move Arrow data over Flight.

gRPC keeps message bytes in glibc ``malloc`` memory (the receive slices, and the contiguous copy
a multi-slice message is gathered into before the IPC reader sees it). A 1-2 MiB message is
above glibc's default ``mmap`` threshold, and the thread arenas shrink their heaps as soon as
the top is free: every message maps, faults in (the kernel zeroes each page) and unmaps fresh
memory. Reading 16 M rows (512 MB) over loopback spent a quarter of its CPU time there
(``perf``: ``clear_page_erms``, ``mprotect``/``madvise`` of arena heaps). Serving allocations
up to 4 MiB from the arenas and keeping up to 64 MiB free at an arena's top removes most of
it (10-25 % less CPU per 16 M-row read over loopback, docs/operations.md).

A server also returns free memory to the system every ``TRIM_EVERY_S`` (``malloc_trim``):
with a thread arena per busy thread, freed message buffers stay scattered inside the arenas'
heaps, which trimming at the top alone never gives back. Under the chaos bench's 16 writers and
64 readers the gateway held 287 MB of malloc memory with 87 MB in use after 2.5 minutes, and
``malloc_trim`` took its resident size from 604 MB to 506 MB.

At most two malloc arenas per core (glibc's default is eight): every arena keeps the memory
its threads freed for those threads' next allocations, and a gateway serving 80 clients runs
over 150 threads. Under the chaos bench's 16 writers and 64 readers (5 minutes, 2 cores) the
resident size went from 409 to 561 MB with glibc's 16 arenas and from 377 to 502 MB with the
limit set. The limit only stops new arenas: set after gRPC's threads had started, it left the 9
those threads had made (``harness_malloc_arenas``), so the gateway sets it before it starts
anything else; 10-minute runs with 4 arenas: 415-446 MB -> 568-577 MB.

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
import time

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
ARENA_MAX = 2 * (os.cpu_count() or 1)

TRIM_EVERY_S = 30.0

_lock = threading.Lock()
_done = False
_trimming = False


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
            ok = libc.mallopt(_M_ARENA_MAX, max(2, ARENA_MAX)) == 1 and ok
        except (OSError, AttributeError):
            return False
        _done = ok
        if not ok:
            log.debug("mallopt refused the Flight allocator settings")
        return ok


def trim_periodically(every_s: float = TRIM_EVERY_S) -> bool:
    """Start (once per process) a daemon thread that calls glibc's ``malloc_trim(0)`` every
    ``every_s``; True when it runs. Only where the settings above are in effect."""
    global _trimming
    with _lock:
        if _trimming or not _done:
            return _trimming
        trim = ctypes.CDLL(None).malloc_trim
        _trimming = True

    def loop() -> None:
        while True:
            time.sleep(every_s)
            trim(0)

    threading.Thread(target=loop, name="harness-malloc-trim", daemon=True).start()
    return True


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def malloc_bytes() -> dict[str, int] | None:
    """What glibc ``malloc`` holds (``mallinfo2``): ``in_use`` by live allocations, ``free``
    inside its heaps (returned only by trimming), ``mmapped`` (large blocks, each returned when
    freed); None where that is not glibc 2.33+."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    info = fn()
    return {
        "in_use": int(info.uordblks),
        "free": int(info.fordblks + info.fsmblks),
        "mmapped": int(info.hblkhd),
    }


def malloc_arenas() -> int | None:
    """How many arenas glibc ``malloc`` has (``malloc_info``'s heaps, the main one included);
    None where that is not glibc."""
    try:
        libc = ctypes.CDLL(None)
        libc.open_memstream.restype = ctypes.c_void_p
        libc.open_memstream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
        libc.free.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    buf, size = ctypes.c_void_p(), ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        return None
    try:
        libc.malloc_info(0, stream)
    finally:
        libc.fclose(stream)  # sets buf and size
    try:
        return ctypes.string_at(buf, size.value).count(b"<heap nr=")
    finally:
        libc.free(buf)
