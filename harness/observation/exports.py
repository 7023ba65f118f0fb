"""What `vpo db export` writes: a campaign's programs or trajectories (a row per rollout with its
reward matrix, what a trainer reads) as JSONL or Parquet. Its plots are `plots`'."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.config.errors import UserError
from harness.observation.views import program_row
from harness.store import Store

# What `vpo db export` writes, by the suffix of --out that says it.
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


def export(store: Store, campaign_id: int, what: str, fmt: str | None, out: Path) -> int:
    """Write programs or trajectories as JSONL or Parquet (`fmt`, else by `out`'s suffix, see
    `export_format`); returns the number of rows. The file appears whole or not at all: it is
    written beside `out` and renamed, and a failed write leaves nothing."""
    if what not in ("programs", "trajectories"):
        raise UserError(f"--what must be programs or trajectories, not {what!r}")
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; name a file in it, such as {out}/{what}.jsonl")
    fmt = export_format(fmt, out)
    if not out.parent.is_dir():  # a typo in the path must not become a tree of new folders
        raise UserError(f"--out {out}: there is no folder {out.parent}; create it first")
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise UserError("--format parquet needs pyarrow: pip install pyarrow") from None
    rows = (
        _program_rows(store, campaign_id)
        if what == "programs"
        else _trajectory_rows(store, campaign_id)
    )
    staging = out.with_name(out.name + ".partial")
    try:
        count = _write_parquet(rows, staging) if fmt == "parquet" else _write_jsonl(rows, staging)
        staging.replace(out)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return count


def export_format(fmt: str | None, out: Path) -> str:
    """jsonl or parquet: `fmt` where given, else what `out`'s suffix says (`FORMATS`). A
    suffix that names the other format is an error, and so is no `fmt` with a suffix that
    names none; `fmt` with any other suffix (`x.txt`, `x`) is taken as given."""
    named = FORMATS.get(out.suffix.lower())
    if fmt is not None:
        if fmt not in ("jsonl", "parquet"):
            raise UserError(f"--format must be jsonl or parquet, not {fmt!r}")
        if named is not None and named != fmt:
            raise UserError(
                f"--format {fmt} and --out {out.name} disagree; leave out --format, or make "
                "them agree"
            )
        return fmt
    if out.suffix.lower() == ".csv":
        raise UserError(
            f"--out {out.name}: CSV is not written (a row holds lists and nested scores); "
            "name it .jsonl or .parquet"
        )
    if named is None:
        raise UserError(
            f"cannot tell the format of --out {out.name} from its suffix; end it in .jsonl, "
            ".json or .parquet, or give --format jsonl or parquet"
        )
    return named


def _write_jsonl(rows: Iterator[dict[str, Any]], path: Path) -> int:
    count = 0
    with path.open("w", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row, default=str) + "\n")
            count += 1
    return count


def _write_parquet(rows: Iterator[dict[str, Any]], path: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(list(rows))
    pq.write_table(table, path)
    return table.num_rows


def _program_rows(store: Store, campaign_id: int) -> Iterator[dict[str, Any]]:
    for p in store.iter_programs(campaign_id):
        yield {
            **program_row(p),
            "code": p.code,
            "code_hash": p.code_hash,
            "error": p.error,
            "eval_seconds": p.eval_seconds,
            "trajectory_id": p.trajectory_id,
            "candidate_index": p.candidate_index,
            "created_at": p.created_at.isoformat(),
        }


def _trajectory_rows(store: Store, campaign_id: int) -> Iterator[dict[str, Any]]:
    """One row per rollout with its group and its (candidates x d) reward matrix, zeros and mask
    False where a candidate holds no program: what a trainer reads."""
    objectives = store.objectives(campaign_id)
    for group, trajectories in store.iter_trajectory_groups(campaign_id):
        wanted = {
            c["program_id"]
            for t in trajectories
            for c in t["candidates"]
            if c.get("program_id") is not None
        }
        scores = {p.id: p.scores for p in store.programs_by_ids(sorted(wanted))}
        for t in trajectories:
            candidates = sorted(t["candidates"], key=lambda c: c["index"])
            yield {
                "group_id": group["id"],
                "iteration": group["iteration"],
                "island": group["island"],
                "parent_id": group["parent_program_id"],
                "draft_ids": group["draft_ids"],
                "prompt": group["prompt"],
                "prompt_token_ids": group["prompt_token_ids"],
                "train_step": group["train_step"],
                "trajectory_id": t["id"],
                "position": t["position"],
                "completion": t["completion"],
                "token_ids": t["token_ids"],
                "logprobs": t["logprobs"],
                "finish_reason": t["finish_reason"],
                "parse_status": t["parse_status"],
                "policy_version_id": t["policy_version_id"],
                "candidates": candidates,
                "objectives": objectives,
                "rewards": [
                    [
                        float(scores.get(c.get("program_id"), {}).get(name, 0.0))
                        for name in objectives
                    ]
                    for c in candidates
                ],
                "mask": [c.get("program_id") is not None for c in candidates],
            }
