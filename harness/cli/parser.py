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
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vpo-evolve")
    except PackageNotFoundError:
        return "unknown"
