"""The C allocator of a `vpo` process: freed memory goes back to the system, between steps.

A campaign on CPU generates and trains in one process, on several threads. glibc's malloc gives
each thread an arena of its own and keeps what a thread frees for its next allocation, and it
raises its mmap threshold each time a large block is freed (up to 32 MiB), so the tensors of a
training step, freed at its end, stay resident. `make demo` on seed 0 (2026-12-07, 2 Xeon cores)
held 8.0 GB once its models were loaded and peaked at 14.4 GB, while a step raises the
process by about 1.5 GB once freed memory is handed back (benchmarks/results/demo_seeds_83cae64.md;
9.0 GB peak against 7.55 loaded in demo_seeds.md).

`settle()` fixes the thresholds instead, before the process allocates much: blocks from
MMAP_THRESHOLD bytes are mapped on their own and unmapped when freed, the heap's free top is
trimmed, and at most ARENAS arenas serve the threads; `release()`, called before and after each
training step, hands back the free pages inside the heaps (glibc's malloc_trim), which the
top's trim cannot reach. The threshold is a trade: a block mapped on its own faults fresh,
zeroed pages in each time, and a training step allocates and frees many blocks of a few MiB
(an MLP activation of a group is 16 MiB in bf16). Demo seed 0's first 8 iterations on 2 AMD
EPYC cores with bf16 (2026-12-07, one run each, docs/generation.md "Memory on a CPU"):
glibc's own thresholds 148 s and 8.79 GB; from 64 KiB, as this module first set it, 194 s and
7.72 GB; from 1 MiB 186 s, 7.70 GB; from 4 MiB 159 s, 7.96 GB; from 32 MiB 130 s, 8.92 GB (the
last three with `release()`). A process whose environment sets a MALLOC_* variable or a
glibc.malloc tunable (GLIBC_TUNABLES) keeps the allocator as the user set it, and `release()`
does nothing there.
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
MMAP_THRESHOLD = 4 * 1024 * 1024
TRIM_THRESHOLD = 1024 * 1024
ARENAS = 2


# glibc, once settle() set it up (find_library runs ldconfig or a compiler: once, not per step)
_libc: ctypes.CDLL | None = None


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
    settled = all(
        mallopt(parameter, value) == 1
        for parameter, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (M_ARENA_MAX, ARENAS),
        )
    )
    if settled:
        global _libc
        _libc = libc
    return settled


def release() -> None:
    """Hand the free pages of every arena back to the system (glibc's malloc_trim), in a
    process `settle()` set up; elsewhere nothing (a test calling in, a user's own settings)."""
    if _libc is not None:
        _libc.malloc_trim(0)
