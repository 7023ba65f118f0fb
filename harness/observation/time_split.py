"""Where a campaign's time goes: the seconds of each stage of its batches, and the cores each kept
busy.

A campaign records one `stages` event per batch (harness/observation/ledger.py writes it):

    {"iterations": [12, 13], "tokens": 1630, "wall": 41.2,
     "loop":   {"selecting": [0.2, 0.2], "generating": [30.1, 58.9], "waiting": [0.0, 0.0],
                "training": [9.8, 19.1], "publishing": [0.9, 1.2]},
     "beside": {"parsing": [0.1, 0.1], "evaluating": [6.3, 11.0], "storing": [0.2, 0.2],
                "reporting": [0.0, 0.0]}}

`loop` holds the stages of the loop's own thread, [wall seconds, CPU seconds]: they follow one
another, so they add up to `wall`, the batch's period (what is left is `other`: budget checks,
bookkeeping). `beside` holds those of the evaluation thread, which runs beside the loop (the
batch before is evaluated while this one generates): their shares of the wall can add up to more
than the whole. A loop stage's CPU seconds are this process's, less the evaluation thread's
(an in-process engine's threads count: the cores it decodes on); `evaluating` counts the
candidates' processes too (their rusage). Cores = CPU seconds / wall seconds.

The event after the last batch holds no iterations: the last wait and the steps on the last
groups. A `vpo worker` does every stage of its batch on one thread, in turn: its events hold
them all under `loop`, with the worker's name.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The stages of the loop's thread, in the order a batch meets them.
LOOP_STAGES = ("selecting", "generating", "waiting", "training", "publishing")
# The evaluation thread's stages, each batch's in this order.
BESIDE_STAGES = ("parsing", "evaluating", "storing", "reporting")
# The event kind a batch's stages are recorded under.
EVENT = "stages"


@dataclass
class Split:
    """The stages of some batches, added up: wall seconds and CPU seconds by stage."""

    batches: int = 0
    wall: float = 0.0
    tokens: int = 0
    loop: dict[str, list[float]] = field(default_factory=dict)
    beside: dict[str, list[float]] = field(default_factory=dict)
    _adding: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, payload: Mapping[str, Any]) -> None:
        """One batch's event (see the module's docstring), or a part of it (a running
        campaign adds a batch's loop stages when they end and its evaluation's later). A
        payload of another shape (a database written by another version) adds what it can
        read."""
        with self._adding:
            self._add(payload)

    def _add(self, payload: Mapping[str, Any]) -> None:
        try:
            wall = float(payload.get("wall", 0.0))
            tokens = int(payload.get("tokens", 0))
        except (TypeError, ValueError):
            return
        self.batches += bool(payload.get("iterations"))
        self.wall += max(wall, 0.0)
        self.tokens += max(tokens, 0)
        for side, into in (("loop", self.loop), ("beside", self.beside)):
            stages = payload.get(side)
            if not isinstance(stages, Mapping):
                continue
            for name, pair in stages.items():
                try:
                    seconds, cpu = float(pair[0]), float(pair[1])
                except (TypeError, ValueError, IndexError, KeyError):
                    continue
                total = into.setdefault(str(name), [0.0, 0.0])
                total[0] += seconds
                total[1] += cpu

    @property
    def other(self) -> float:
        """Seconds of the loop's wall no stage took (budget checks, bookkeeping)."""
        return max(self.wall - sum(seconds for seconds, _ in self.loop.values()), 0.0)

    def share(self, side: str, name: str) -> float:
        seconds = getattr(self, side).get(name, [0.0, 0.0])[0]
        return seconds / self.wall if self.wall > 0 else 0.0

    def cores(self, side: str, name: str) -> float | None:
        seconds, cpu = getattr(self, side).get(name, [0.0, 0.0])
        return cpu / seconds if seconds > 0 else None

    def as_json(self) -> dict[str, Any]:
        """Shares of the wall and cores, by stage, for `vpo status --json` and benchmarks."""

        def stages(side: str, names: Iterable[str]) -> dict[str, dict[str, float | None]]:
            return {
                name: {
                    "seconds": round(getattr(self, side)[name][0], 3),
                    "share": round(self.share(side, name), 4),
                    "cores": _rounded(self.cores(side, name)),
                }
                for name in names
                if name in getattr(self, side)
            }

        return {
            "batches": self.batches,
            "wall_s": round(self.wall, 3),
            "tokens_per_s": round(self.tokens / self.wall, 2) if self.wall > 0 else None,
            "loop": stages("loop", _ordered(self.loop, LOOP_STAGES)),
            "other_share": round(self.other / self.wall, 4) if self.wall > 0 else None,
            "beside": stages("beside", _ordered(self.beside, BESIDE_STAGES)),
            "line": self.line(),
        }

    def line(self) -> str:
        """`generating 71% (1.9 cores), training 20% (2.0), ...; beside: evaluating 30% (1.1)`;
        stages under 0.5% of the wall left out, "" before any stage was timed."""
        if self.wall <= 0:
            return ""
        loop = self._parts("loop", _ordered(self.loop, LOOP_STAGES))
        beside = self._parts("beside", _ordered(self.beside, BESIDE_STAGES))
        text = ", ".join(loop)
        return f"{text}; beside: {', '.join(beside)}" if beside else text

    def _parts(self, side: str, names: Iterable[str]) -> list[str]:
        parts = []
        for name in names:
            share = self.share(side, name)
            if share < 0.005:
                continue
            cores = self.cores(side, name)
            busy = "" if cores is None else f" ({cores:.1f} cores)"
            parts.append(f"{name} {share:.0%}{busy}")
        return parts


def split(payloads: Iterable[Mapping[str, Any]]) -> Split:
    """The payloads of `stages` events, added up."""
    total = Split()
    for payload in payloads:
        if isinstance(payload, Mapping):
            total.add(payload)
    return total


def _ordered(stages: Mapping[str, Any], known: tuple[str, ...]) -> list[str]:
    return [name for name in known if name in stages] + sorted(set(stages) - set(known))


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
