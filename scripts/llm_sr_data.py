"""Build problems/equation_discovery/data/<problem>.npz from LLM-SR's CSV files.

Usage: python scripts/llm_sr_data.py CSV_ROOT
(CSV_ROOT holds <problem>/{train,test_id,test_ood}.csv, as LLM-SR's data/ folder does:
github.com/deep-symbolic-mathematics/LLM-SR, MIT licence)

Each .npz holds `columns` (the CSV header) and one float64 array per split with the target in the
last column. The numbers are parsed with Python's float(), which rounds each decimal exactly once,
so the arrays are the CSV's values bit for bit; compressed, the four files take 2.6 MB against
6.5 MB of CSV.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

PROBLEMS = ("oscillator1", "oscillator2", "bactgrow", "stressstrain")
SPLITS = ("train", "test_id", "test_ood")
OUT = Path(__file__).parents[1] / "problems" / "equation_discovery" / "data"


def read_split(path: Path) -> tuple[list[str], np.ndarray]:
    with path.open(newline="") as handle:
        header, *rows = list(csv.reader(handle))
    return header, np.array([[float(v) for v in row] for row in rows], dtype=np.float64)


def main(root: Path) -> None:
    for problem in PROBLEMS:
        splits = {}
        for split in SPLITS:
            header, splits[split] = read_split(root / problem / f"{split}.csv")
        np.savez_compressed(OUT / f"{problem}.npz", columns=np.array(header), **splits)
        shapes = ", ".join(f"{s} {a.shape}" for s, a in splits.items())
        print(f"{problem}: {', '.join(header)}; {shapes}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    main(Path(sys.argv[1]))
