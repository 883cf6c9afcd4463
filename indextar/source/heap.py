"""A reading process's C heap: what it frees kept for what it allocates next.

A process that reads ahead allocates, for every sample, a buffer for its span (on the
event loop's thread) and the bytes of its members (in the thread that reads the
batch), about 100 kB each for 100 kB samples, and frees both a batch later: 6.4 MB a
batch of 64, allocated again at the next batch. glibc's ``malloc`` gives memory free
at the top of a heap back to the kernel once more than ``M_TRIM_THRESHOLD`` is free
there (``brk`` down, or ``madvise(MADV_DONTNEED)`` in a thread's arena), and serves
every block of ``M_MMAP_THRESHOLD`` or more by an ``mmap`` of its own, unmapped when
it is freed. Both start at 128 kB; glibc raises them itself (to the size of a freed
mapped block, and twice that, at most 32 and 64 MiB) only once a block over the
threshold has been freed, so whether a process gives its batches back to the kernel
and faults them in again at the next batch depends on what it happened to allocate
before. Measured (tools/bench_remote.py's i.i.d. read-ahead, 2 DataLoader workers, 8,000
samples of 100 kB): 27,000-67,000 page faults in each worker's reading thread and
0.1-0.3 s of system CPU each, 5,400 and 0.02-0.06 s with the thresholds below.

:func:`keep_freed_heap` sets them, once a process, to where glibc's own rule takes
them at most: blocks under 32 MiB from the heap, and up to 64 MiB free at a heap's
top kept. The resident memory never exceeds what the process had allocated at its
peak; it is only not given back below it. A child forked from such a process gives
back at once the free heap it inherited (``malloc_trim``): those pages are still its
parent's, and every block it allocated in them would first be copied, one page fault
and a TLB flush a page (0.2-0.3 s of a DataLoader worker's start, measured). A process
whose environment sets either
threshold (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``, or
``glibc.malloc.*`` in ``GLIBC_TUNABLES``) keeps its own; elsewhere than glibc on a
64-bit machine nothing changes.

:func:`freeze_startup_objects` does for Python's cyclic garbage collector what the
thresholds do for ``malloc``. A reading worker allocates container objects by the
thousand a batch (a task, its coroutines and futures, a response's headers and answer
for every span), and with over a hundred requests in flight many of them outlive the
young generations' collections, so the collector runs its full collections too, each
over every object the worker inherited (240,000 in a process that imported torch),
and writes to each one's header, a page copied from the parent for every few. Measured
(the same benchmark, 24,000 samples, 12,000 a worker, 2.9-3.4 s of CPU each): 0.49 s
of a worker's CPU in the collector, a full collection of 0.25 s among it; 0.10 s with
the objects alive at its first read-ahead frozen (``gc.freeze``: left out of every
collection). Frozen objects are still freed when
nothing refers to them; only a reference cycle among them outlives the worker's use
of it, as with every object a forked worker shares with its parent.
"""

from __future__ import annotations

import gc
import logging
import os
import sys

__all__ = ["KEPT_BYTES", "MAPPED_FROM_BYTES", "freeze_startup_objects", "keep_freed_heap"]

log = logging.getLogger(__name__)

MAPPED_FROM_BYTES = 32 << 20
"""Blocks this large or larger get an ``mmap`` of their own (glibc's highest
``M_MMAP_THRESHOLD`` on a 64-bit machine)."""
KEPT_BYTES = 2 * MAPPED_FROM_BYTES
"""Free bytes at the top of a heap kept for the next allocations (``M_TRIM_THRESHOLD``,
twice the one above, as glibc's own rule sets it)."""

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h
_USER_SET = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")
_USER_TUNABLES = ("glibc.malloc.trim_threshold", "glibc.malloc.mmap_threshold")

_kept = False  # in this process (and a forked child, whose heap is its parent's)
_frozen = False  # the same for the collector's frozen objects


def keep_freed_heap() -> bool:
    """Have this process's ``malloc`` keep what it frees for its next allocations
    (glibc, 64-bit), once; whether it does now."""
    global _kept
    if _kept:
        return True
    if sys.maxsize < 2**32 or not _glibc() or _set_by_user():
        return False
    import ctypes

    libc = ctypes.CDLL(None)
    mallopt, trim = libc.mallopt, libc.malloc_trim
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    # the mapping threshold first: setting either stops glibc's own adjustments
    _kept = bool(mallopt(_M_MMAP_THRESHOLD, MAPPED_FROM_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, KEPT_BYTES)
    )
    if _kept:
        os.register_at_fork(after_in_child=lambda: trim(0))
    else:
        log.debug("mallopt refused the thresholds: the heap is left as it is")
    return _kept


def freeze_startup_objects() -> None:
    """Leave every object the collector tracks now out of its later collections
    (``gc.freeze``), once a process (a forked child's inherited objects are frozen
    already where its parent froze them)."""
    global _frozen
    if not _frozen:
        gc.freeze()
        _frozen = True


def _glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError):
        return False


def _set_by_user() -> bool:
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return any(name in os.environ for name in _USER_SET) or any(
        name in tunables for name in _USER_TUNABLES
    )
