"""What every benchmark does last: print its report and write it where the README points."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

STOP_GRACE_S = 10  # seconds a run's process group has between SIGTERM and SIGKILL


def publish(path: Path, report: str) -> None:
    print(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report)
    print(f"written to {path}")


def stop(process: subprocess.Popen[str]) -> None:
    """End a run still going: SIGTERM to its process group, SIGKILL after a grace period."""
    if process.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=STOP_GRACE_S)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
