"""A `vpo` process hands freed memory back (harness/config/allocator.py): in a fresh process,
blocks of SIZE MiB, each followed by a 2 KiB block that stays, are freed (200 MiB in all);
with glibc's own thresholds the freed blocks stay resident (the heap cannot shrink past the
small ones); with `settle()` a block from its mmap threshold leaves when freed, and a smaller
one at `release()`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import allocator

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = r"""
import ctypes, sys
from harness.config import allocator
settled = allocator.settle() if sys.argv[1] == "settle" else False
SIZE = int(sys.argv[2])
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
def resident_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
MIB = 1 << 20
first = libc.malloc(SIZE * MIB); libc.memset(first, 1, SIZE * MIB); libc.free(first)
before = resident_mib()
blocks, pins = [], []
for _ in range(200 // SIZE):
    block = libc.malloc(SIZE * MIB); libc.memset(block, 1, SIZE * MIB); blocks.append(block)
    pins.append(libc.malloc(2048))  # past the small bins Python freed: right after its block
held = resident_mib()
for block in blocks:
    libc.free(block)
freed = resident_mib()
allocator.release()
print(settled, before, held, freed, resident_mib())
"""

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's allocator and /proc: Linux only"
)


def _run(mode: str, size: int = 1, **env: str) -> tuple[bool, int, int, int, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode, str(size)],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    settled, *resident = done.stdout.split()
    before, held, freed, released = map(int, resident)
    return settled == "True", before, held, freed, released


def test_settled_large_freed_blocks_leave_when_freed() -> None:
    size = 8  # MiB: above the mmap threshold
    assert size << 20 >= allocator.MMAP_THRESHOLD
    settled, before, held, freed, _ = _run("settle", size)
    assert settled
    assert held - before >= 190  # the 200 MiB were resident
    assert freed - before < 20, (before, held, freed)


def test_settled_small_freed_blocks_leave_at_release() -> None:
    """Blocks below the threshold come from the heap: kept while the step runs, handed back
    by release() between steps."""
    settled, before, held, freed, released = _run("settle", 1)
    assert settled
    assert held - before >= 190
    assert freed - before > 150, (before, held, freed)  # the pins hold the heap
    assert released - before < 20, (before, held, freed, released)


def test_without_it_glibc_keeps_them() -> None:
    """What settle() is for: the same frees, glibc's thresholds, the memory stays (and
    release() does nothing in a process settle() did not set up)."""
    settled, before, held, freed, released = _run("default", 8)
    assert not settled
    assert freed - before > 150, (before, held, freed)
    assert released - before > 150, (before, held, freed, released)


def test_a_malloc_variable_in_the_environment_is_the_users_choice() -> None:
    settled, before, held, freed, released = _run("settle", 1, MALLOC_ARENA_MAX="4")
    assert not settled
    assert released - before > 150, (before, held, freed, released)
