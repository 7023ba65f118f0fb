"""`vpo warmup`: teach a model the answer format from its own well-formed answers
(harness/evolution/warmup.py), and say how the parse rate moved."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.cli.flags import add_setting, given_settings, positive_float, positive_int
from harness.config.errors import UserError
from harness.config.settings import CAMPAIGN_KEYS
from harness.evolution.warmup import (
    WARMUP_FULL_LEARNING_RATE,
    WARMUP_LORA_LEARNING_RATE,
    WarmupSettings,
)

DEFAULTS = WarmupSettings()
# The campaign settings the warm-up samples with (the rest are the file's or the defaults).
SAMPLED = ("model", "backend", "candidates", "max_tokens", "temperature", "seed")
WORDS = {
    "model": "the model to warm up (default: the campaign's)",
    "backend": "what samples: auto, vllm or transformers (default: auto)",
}


def add_commands(commands: Any) -> None:
    p = commands.add_parser(
        "warmup",
        help="fine-tune a model on its own well-formed answers to a problem's first prompt, "
        "so that it writes all m candidates in their tags (before a campaign)",
    )
    p.add_argument("problem", help="a registered problem name, or a folder holding problem.py")
    p.add_argument("--out", required=True, help="an empty folder for the warmed-up model")
    p.add_argument("--config", default=None, help="a TOML file with campaign settings")
    for name in SAMPLED:
        add_setting(p, CAMPAIGN_KEYS[name], help=WORDS.get(name))
    p.add_argument(
        "--samples",
        type=positive_int,
        default=DEFAULTS.samples,
        help=f"answers sampled to choose the well-formed from (default {DEFAULTS.samples})",
    )
    p.add_argument(
        "--epochs",
        type=positive_int,
        default=DEFAULTS.epochs,
        help=f"passes over the well-formed answers (default {DEFAULTS.epochs})",
    )
    p.add_argument(
        "--measure",
        type=int,
        default=DEFAULTS.measure,
        help=f"answers sampled after, to measure the parse rate (default {DEFAULTS.measure}; 0: "
        "skip)",
    )
    p.add_argument("--full", action="store_true", help="train every weight, not a LoRA adapter")
    p.add_argument("--lora-rank", dest="lora_rank", type=positive_int, default=DEFAULTS.lora_rank)
    p.add_argument(
        "--lr",
        dest="learning_rate",
        type=positive_float,
        default=None,
        help=f"learning rate (default {WARMUP_LORA_LEARNING_RATE:g} for LoRA, "
        f"{WARMUP_FULL_LEARNING_RATE:g} for --full)",
    )
    p.set_defaults(handler=cmd_warmup)


def cmd_warmup(args: argparse.Namespace) -> int:
    from harness.cli.programs import program_problem
    from harness.config.files import load_toml
    from harness.config.settings import build
    from harness.evolution.warmup import warm_up

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} exists and is not an empty folder")
    problem = program_problem(args.problem)
    flags = {"problem": args.problem, **given_settings(args, SAMPLED)}
    file = load_toml(args.config) if args.config else {}
    config = build(file, flags, where=args.config or "the flags")
    settings = WarmupSettings(
        samples=args.samples,
        epochs=args.epochs,
        measure=args.measure,
        lora=not args.full,
        lora_rank=args.lora_rank,
        learning_rate=args.learning_rate
        or (WARMUP_FULL_LEARNING_RATE if args.full else WARMUP_LORA_LEARNING_RATE),
    )
    report = warm_up(config, problem, settings, out)
    before, after = report["parse_rate_before"], report.get("parse_rate_after")
    moved = "" if after is None else f", parse rate {before:.0%} -> {after:.0%}"
    print(f"model written to {out} (vpo run {args.problem} --model {out}){moved}")
    return 0
