"""The C allocator of a `vpo` process: freed memory goes back to the system.

A campaign on CPU generates and trains in one process, on several threads. glibc's malloc gives
each thread an arena of its own and keeps what a thread frees for its next allocation, and it
raises its mmap threshold each time a large block is freed (up to 32 MiB), so the tensors of a
training step, freed at its end, stay resident. `make demo` on seed 0 (2026-12-07, 2 Xeon cores)
held 8.0 GB once its models were loaded and peaked at 14.4 GB, while a step raises the
process by about 1.5 GB once freed memory is handed back (benchmarks/results/demo_seeds_83cae64.md;
9.0 GB peak against 7.55 loaded in demo_seeds.md).

`settle()` fixes the thresholds instead, before the process allocates much: blocks from
MMAP_THRESHOLD bytes are mapped on their own and unmapped when freed, the heap's free top is
trimmed, and at most ARENAS arenas serve the threads. The same campaign, the same trajectory,
then peaked at 9.0 GB (benchmarks/results/demo_seeds.md), but its 16 iterations took 629 s
against 516: a freed block's pages go back to the system, and the next block of that size
faults fresh, zeroed pages in (the training step most). A process whose environment sets a
MALLOC_* variable or a glibc.malloc tunable (GLIBC_TUNABLES) keeps the allocator as the user
set it: `MALLOC_TOP_PAD_=131072` (glibc's default value) trades the memory back for the time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# mallopt's parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 64 * 1024
TRIM_THRESHOLD = 1024 * 1024
ARENAS = 2


def settle() -> bool:
    """Set glibc's thresholds as above; False where they were not set (not glibc, or the
    environment chose its own malloc settings)."""
    chosen = any(name.startswith("MALLOC_") for name in os.environ) or "glibc.malloc." in (
        os.environ.get("GLIBC_TUNABLES", "")
    )
    if not sys.platform.startswith("linux") or chosen:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl has no mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return all(
        mallopt(parameter, value) == 1
        for parameter, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (M_ARENA_MAX, ARENAS),
        )
    )
