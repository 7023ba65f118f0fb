"""The stopwatch of a campaign's batches: each stage's wall and CPU seconds, recorded once a batch
is stored as a `stages` event (what it holds, and how `vpo status` adds them up:
harness/observation/time_split.py).

    clock = LoopClock()                     # the loop's thread
    with clock.stage("generating"):
        ...
    wall, loop = clock.period()             # this batch's period and its stages, then afresh

    ledger = Ledger()                       # the evaluation thread's, one per batch
    with ledger.stage("evaluating", sandbox_cpu):
        ...
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any


class Ledger:
    """Wall and CPU seconds by stage, on one thread; `cpu` reads that thread's CPU clock."""

    def __init__(self, cpu: Callable[[], float] = time.thread_time) -> None:
        self._cpu = cpu
        self.stages: dict[str, list[float]] = {}

    @contextmanager
    def stage(self, name: str, elsewhere: Callable[[], float] | None = None) -> Iterator[None]:
        """Time the block as `name`; `elsewhere` reads CPU seconds spent outside this thread's
        clock on its behalf (the sandbox's candidate processes), added to the stage's."""
        wall, cpu = time.perf_counter(), self._cpu()
        outside = elsewhere() if elsewhere else 0.0
        try:
            yield
        finally:
            spent = self.stages.setdefault(name, [0.0, 0.0])
            spent[0] += time.perf_counter() - wall
            spent[1] += self._cpu() - cpu + (elsewhere() - outside if elsewhere else 0.0)

    def take(self) -> dict[str, list[float]]:
        """The stages so far, rounded for storage; the ledger starts again empty."""
        taken = {name: [round(s, 4), round(max(c, 0.0), 4)] for name, (s, c) in self.stages.items()}
        self.stages = {}
        return taken


def timed(
    ledger: Ledger | None, name: str, elsewhere: Callable[[], float] | None = None
) -> AbstractContextManager[None]:
    """`ledger.stage(name, elsewhere)`, or nothing when no ledger times this caller."""
    return nullcontext() if ledger is None else ledger.stage(name, elsewhere)


class LoopClock:
    """The loop thread's ledger and the period of each batch. Its CPU clock is this process's,
    less the evaluation thread's (`watch`): an in-process engine decodes on threads of its own,
    which count toward generating; what the evaluation thread spends meanwhile does not."""

    def __init__(self) -> None:
        self._other: int | None = None
        self._other_last = 0.0
        self.ledger = Ledger(self._cpu)
        self._mark = time.perf_counter()

    def watch(self, thread_ident: int) -> None:
        """Leave the CPU time of thread `thread_ident` (the evaluation thread) out."""
        try:
            self._other = time.pthread_getcpuclockid(thread_ident)
        except (AttributeError, OSError):  # no per-thread clocks here: count the process
            self._other = None
        self.ledger = Ledger(self._cpu)

    def _cpu(self) -> float:
        if self._other is not None:
            try:
                self._other_last = time.clock_gettime(self._other)
            except OSError:  # the thread ended: its time stays what it was
                pass
        return time.process_time() - self._other_last

    def stage(self, name: str) -> AbstractContextManager[None]:
        return self.ledger.stage(name)

    def period(self) -> tuple[float, dict[str, list[float]]]:
        """Seconds since the last period ended (or the clock started), and the stages timed in
        them; the next period starts now."""
        now = time.perf_counter()
        wall, self._mark = now - self._mark, now
        return wall, self.ledger.take()


def batch_payload(
    iterations: Sequence[int],
    tokens: int,
    wall: float,
    loop: dict[str, list[float]],
    beside: dict[str, list[float]],
) -> dict[str, Any]:
    """A batch's `stages` event (harness/observation/time_split.py)."""
    return {
        "iterations": list(iterations),
        "tokens": tokens,
        "wall": round(wall, 4),
        "loop": loop,
        "beside": beside,
    }
