"""A `vpo` process hands freed memory back (harness/config/allocator.py): in a fresh process,
200 blocks of 1 MiB, each followed by a small block that stays, are freed; with glibc's own
thresholds the freed blocks stay resident (the heap cannot shrink past the small ones), with
`settle()` they are unmapped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = r"""
import ctypes, sys
from harness.config import allocator
settled = allocator.settle() if sys.argv[1] == "settle" else False
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
first = libc.malloc(MIB); libc.memset(first, 1, MIB); libc.free(first)
before = resident_mib()
blocks, pins = [], []
for _ in range(200):
    block = libc.malloc(MIB); libc.memset(block, 1, MIB); blocks.append(block)
    pins.append(libc.malloc(64))
held = resident_mib()
for block in blocks:
    libc.free(block)
print(settled, before, held, resident_mib())
"""

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's allocator and /proc: Linux only"
)


def _run(mode: str, **env: str) -> tuple[bool, int, int, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    settled, before, held, after = done.stdout.split()
    return settled == "True", int(before), int(held), int(after)


def test_settled_freed_blocks_leave_the_process() -> None:
    settled, before, held, after = _run("settle")
    assert settled
    assert held - before >= 190  # the 200 MiB were resident
    assert after - before < 20, (before, held, after)


def test_without_it_glibc_keeps_them() -> None:
    """What settle() is for: the same frees, glibc's thresholds, the memory stays."""
    settled, before, held, after = _run("default")
    assert not settled
    assert after - before > 150, (before, held, after)


def test_a_malloc_variable_in_the_environment_is_the_users_choice() -> None:
    settled, before, held, after = _run("settle", MALLOC_ARENA_MAX="4")
    assert not settled
    assert after - before > 150, (before, held, after)
