"""Freed heap memory goes back to the OS when asked (glibc keeps it otherwise)."""

from __future__ import annotations

import ctypes

from trainer.memory import release_freed_memory, resident_gib


def test_memory_freed_in_small_blocks_stays_resident_until_released():
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    release_freed_memory()  # from a trimmed heap: the blocks below cannot reuse pages already resident
    before = resident_gib()
    blocks = [libc.malloc(100_000) for _ in range(5_000)]  # 0.5 GB below the mmap threshold: the heap
    for block in blocks:
        ctypes.memset(block, 1, 100_000)
    for block in blocks[:-1]:  # the last block pins the top of the heap, as live tensors do
        libc.free(block)
    held = resident_gib()
    assert held - before > 0.3  # the premise: malloc kept what was freed
    assert release_freed_memory()
    assert held - resident_gib() > 0.3
    libc.free(blocks[-1])
