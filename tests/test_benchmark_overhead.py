"""benchmarks/harness_overhead.py runs the loop's own functions stage by stage: run small, it
still goes through every stage and writes its table (it once broke unseen when those
functions moved)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_overhead_benchmark_runs_every_stage_and_writes_its_table(tmp_path: Path) -> None:
    out = tmp_path / "overhead.md"
    done = subprocess.run(
        [sys.executable, "benchmarks/harness_overhead.py", "--sizes", "200", "--iterations", "4",
         "--warmup", "1", "--no-openevolve", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    table = out.read_text()
    row = next(line for line in table.splitlines() if line.startswith("| 200 -> "))
    cells = [cell.strip().strip("*") for cell in row.strip("|").split("|")]
    assert len(cells) == 10 and all(float(cell) >= 0 for cell in cells[1:])
    assert "Not measured (--no-openevolve)." in table
