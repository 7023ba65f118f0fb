"""Named points where a test can have the process kill itself with SIGKILL.

`VPO_FAULT=NAME:K` kills the process the K-th time it passes point NAME (K defaults to 1): a
real kill at a moment a timer could only hit by luck (inside a database transaction, between
saving a policy version and recording it). Unset, a point costs one comparison.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

_TARGET, _, _COUNT = os.environ.get("VPO_FAULT", "").partition(":")
_passes: Counter[str] = Counter()

POINTS = ("iteration_commit", "train_step", "train_saved", "train_commit")


def point(name: str) -> None:
    if name != _TARGET:
        return
    _passes[name] += 1
    if _passes[name] >= int(_COUNT or 1):
        os.kill(os.getpid(), signal.SIGKILL)
