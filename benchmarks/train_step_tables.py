"""Every cell `benchmarks/train_step_speed.py` measured, in one table: the runs' own result files
read back (each row keeps the dtype and the file, whose first lines hold its command and date).

    python benchmarks/train_step_tables.py [RESULT.md ...] [--out FILE.md]

A cell is one run's: its shared, per-row and TRL columns were measured side by side in that
run; rows from different runs (machines with and without bf16, other limits) are not compared
with each other. Writes benchmarks/results/train_step_speed.md by default.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reporting import publish  # noqa: E402

SOURCES = (
    "train_step_speed_base.md",
    "train_step_speed_qwen_trl.md",
    "train_step_speed_qwen_grid.md",
    "train_step_speed_qwen_full.md",
    "train_step_speed_grid.md",
    "train_step_speed_4000.md",
    "train_step_speed_g16.md",
    "train_step_speed_prefix.md",
    "train_step_speed_prefix_g16.md",
)
METHODS = ("shared", "per-row", "TRL")


def read(path: Path) -> tuple[str, str, list[dict[str, str]]]:
    """The file's dtype, command and table rows (column name -> cell)."""
    text = path.read_text()
    dtype = re.search(r"dtype (\w+)", text)
    command = re.search(r"- command: `([^`]*)`", text)
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [
        dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        for line in lines[1:]
        if not line.startswith("|---")
    ]
    return (dtype.group(1) if dtype else "?"), (command.group(1) if command else "?"), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="result files (default: SOURCES)")
    parser.add_argument("--out", type=Path, default=RESULTS / "train_step_speed.md")
    args = parser.parse_args()
    files = args.files or [RESULTS / name for name in SOURCES if (RESULTS / name).exists()]
    lines = [
        "# One training step at the harness's shapes: every cell measured",
        "",
        "Each row is one cell of one run of `benchmarks/train_step_speed.py`: its shared,"
        " per-row and TRL columns ran side by side in that run, on 2 CPU cores (one group a step,"
        " two objectives, beta 1e-3, LoRA r = 16 on all linear layers or full fine-tuning, one"
        " AdamW step). Rows of different runs come from different machines (fp32 only, or bf16"
        " where the CPU has AVX-512 BF16) and limits: compare the ratios within a row. `> N`: the"
        " side ran past the run's limit of N s (load and any untimed step included); `killed`:"
        " out of memory on 24 GiB. The file named in each row has the run's command, date and"
        " settings. The shared step of the runs before train_step_speed_prefix*.md attended"
        " under a dense block mask over the packed row; from those on, through the prompt-sharing"
        " attention (trainer/prompt_attention.py, docs/training.md). Collected by"
        " `python benchmarks/train_step_tables.py`.",
        "",
        "| model | training | P | C | G | dtype | shared s | per-row s | TRL s"
        " | shared peak GiB | per-row peak GiB | TRL peak GiB | vs per-row | vs TRL | run |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    commands = []
    for path in files:
        dtype, command, rows = read(path)
        commands.append((path.name, command))
        for row in rows:
            seconds = [row.get(f"{m} s/step", "-") for m in METHODS]
            peaks = [row.get(f"{m} peak GiB", "-") for m in METHODS]
            lines.append(
                f"| {row['model']} | {row['training']} | {row['P']} | {row['C']} | {row['G']}"
                f" | {dtype} | "
                + " | ".join(seconds)
                + " | "
                + " | ".join(peaks)
                + f" | {row['vs per-row']} | {row['vs TRL']} | [{path.name}]({path.name}) |"
            )
    lines += ["", "The runs:", ""]
    lines += [f"- [{name}]({name}): `{command}`" for name, command in commands]
    publish(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
