"""The `vpo` parser: one module per group of commands adds its own."""

from __future__ import annotations

import argparse

from harness.cli import campaigns, database, programs, train, warmup
from harness.cli.flags import VpoParser, add_subcommands


def build_parser() -> argparse.ArgumentParser:
    parser = VpoParser(prog="vpo", description="LLM-driven discovery kept diverse by VPO.")
    parser.add_argument("--version", action="version", version=f"vpo-evolve {_version()}")
    commands = add_subcommands(parser, "command")
    programs.add_commands(commands)  # problems, eval
    campaigns.add_commands(commands)  # run, worker
    train.add_commands(commands)
    warmup.add_commands(commands)
    database.add_commands(commands)  # status, db, ui
    campaigns.add_config_command(commands)  # config show
    _add_logging_flags(parser, top=True)
    return parser


def _add_logging_flags(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """-v, -q and --log-dir, before or after the command (`vpo -v run ...`, `vpo run ... -v`):
    on every parser, and set only where given below the top (argparse would otherwise let a
    command's default overwrite the top's value)."""
    default: dict[str, object] = {} if top else {"default": argparse.SUPPRESS}
    parser.add_argument(
        "-v", "--verbose", action="count", help="say more (debug messages)", **default
    )
    parser.add_argument(
        "-q", "--quiet", action="count", help="say less (-q warnings, -qq errors only)", **default
    )
    parser.add_argument(
        "--log-dir",
        help="where a long command writes its log file (default: beside a SQLite database, "
        "runs/ for a URL)",
        **({"default": None} if top else default),
    )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                _add_logging_flags(sub)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vpo-evolve")
    except PackageNotFoundError:
        return "unknown"
