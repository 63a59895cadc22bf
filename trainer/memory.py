"""The training process's memory: give freed heap back to the OS, and read what the process holds.

glibc's malloc keeps freed memory in its arenas (one per busy thread, in 64 MB heaps) instead of returning
it, so a long run's resident size climbs to its worst phase's high-water mark plus fragmentation and stays
there. Measured on a complementary grid cell here: 20.0 GB resident, 11.2 GB after one ``malloc_trim(0)``.
``release_freed_memory`` asks for that back once per step; elsewhere than glibc it does nothing.

``ONE_PASS`` lets one micro-batch's forward and backward run at a time in a process: the actor's update (the
loop's thread) and πϕ's (the extractor track's thread, in a one-process run) would otherwise hold both sets of
activations at once when they overlap. They share the same cores (or GPU), so taking turns costs little time,
and the peak holds the larger set, not both (``trainer.plan`` counts it so).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading

ONE_PASS = threading.Lock()
"""Held for one micro-batch's forward and backward pass by every trainer of a process."""


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def release_freed_memory() -> bool:
    """Return the heap memory malloc holds free to the OS; True if some was returned."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def resident_gib() -> float:
    """This process's resident set size in GiB (0.0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except OSError:
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30
