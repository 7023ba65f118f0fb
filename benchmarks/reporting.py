"""What every benchmark does last: print its report and write it where the README points."""

from __future__ import annotations

from pathlib import Path


def publish(path: Path, report: str) -> None:
    print(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report)
    print(f"written to {path}")
