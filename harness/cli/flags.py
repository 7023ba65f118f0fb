"""What every command's parser shares: one-line usage errors, the argument types, and the
settings as flags, made from the fields of `CampaignSettings` and its `TrainSettings` so that a
new setting is written once (harness/config/settings.py, training.py) and every command that
takes settings has its flag, with the same name, help and default."""

from __future__ import annotations

import argparse
import copy
from dataclasses import Field
from typing import Any, NoReturn

from harness.config.errors import UserError
from harness.config.settings import CAMPAIGN_KEYS, TRAINING_KEYS
from harness.config.values import REPORTING, SETTINGS, TRAINING

MAX_ROWS = 1_000_000  # `vpo db top -n`
MAX_K = 1000  # `vpo db bestk --k`: each k is one pass over every candidate slot
MAX_DESCENDANTS = 10_000  # `vpo db lineage -n`: a table, not an export
# The settings that are flags: every field made with `harness.config.values.setting`.
SETTING_FLAGS = {
    name: f for name, f in {**CAMPAIGN_KEYS, **TRAINING_KEYS}.items() if "help" in f.metadata
}
# The training settings `vpo train` takes as flags (a campaign-only one acts in the loop).
TRAIN_FLAGS = {
    name: f
    for name, f in TRAINING_KEYS.items()
    if name in SETTING_FLAGS and not f.metadata["campaign_only"]
}


class DefaultsShown(argparse.HelpFormatter):
    """Help that ends each flag's text with its default, where it has one and the text does
    not give it already: no "default: None" for a flag that is unset unless given, nor
    "default: False" for a switch."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not _has_default(action) or "default" in text:
            return action.help
        return f"{text} (default: %(default)s)"

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and _has_default(action):  # argparse shows no line for no help
            action = copy.copy(action)
            action.help = "default: %(default)s"
        return super()._format_action(action)


def _has_default(action: argparse.Action) -> bool:
    default = action.default
    unset = default is None or default == argparse.SUPPRESS or default in ("", (), [])
    return not unset and not isinstance(default, bool)


class VpoParser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsShown)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # argparse prints usage over several lines
        raise UserError(f"{message} (see `{self.prog} --help`)")


def add_subcommands(parser: argparse.ArgumentParser, dest: str) -> Any:
    """The subcommands of `parser`, one of which must be given. Checked by a handler that runs
    once parsing is done, not by argparse's `required`, which would answer `vpo --bogus` with
    the missing command rather than the flag it does not know."""

    def missing(_args: argparse.Namespace) -> int:
        parser.error(f"give a command: {', '.join(commands.choices)}")

    commands = parser.add_subparsers(dest=dest, parser_class=VpoParser)
    parser.set_defaults(handler=missing)
    return commands


def add_campaign_flags(p: argparse.ArgumentParser) -> None:
    """--config, --db, --name, and a flag per setting (None when not given, so the file and
    the stored campaign are overridden only by the flags on the command line)."""
    p.add_argument("--config", default=None, help="a TOML file with campaign settings")
    p.add_argument(
        "--db",
        default=None,
        help="database file or URL (default: runs/PROBLEM.db; postgresql://... works)",
    )
    p.add_argument("--name", default=None, help="campaign name (default: the problem's name)")
    groups = {title: p.add_argument_group(title) for title in (SETTINGS, TRAINING, REPORTING)}
    for field in SETTING_FLAGS.values():
        add_setting(groups[field.metadata["group"]], field)


def add_setting(
    group: Any, field: Field[Any], help: str | None = None, default: Any = None
) -> None:
    """The flag of setting `field`, with its own help or `help`: None unless given, or
    `default` (a benchmark's protocol), which its help then names beside the product's. A
    switch that is on by default is `--no-name`."""
    meta = field.metadata
    kind = str(field.type).removesuffix(" | None")
    negated = kind == "bool" and field.default is True
    names = [setting_flag(field.name)]
    if meta["short"]:
        names.insert(0, meta["short"])
    options: dict[str, Any] = {
        "dest": field.name,
        "default": default,
        "help": help or meta["help"].format(default=_shown(field.default)),
    }
    if default is not None:
        options["help"] += f"; here {_shown(default)}"
    if kind == "bool":
        options |= {"action": "store_const", "const": not negated}
    elif kind in ("int", "float"):
        options["type"] = int if kind == "int" else float
    if help is None and default is None and field.default in (None, ()):
        options["help"] = meta["help"]  # its words say what unset means
    group.add_argument(*names, **options)


def add_protocol(parser: argparse.ArgumentParser, protocol: dict[str, Any]) -> None:
    """A benchmark's campaign settings as flags (the product's names, help and types), each
    defaulting to the benchmark's `protocol` value."""
    group = parser.add_argument_group(
        "campaign settings (as `vpo run` takes them; the defaults are this benchmark's)"
    )
    for name, value in protocol.items():
        add_setting(group, SETTING_FLAGS[name], default=value)


def protocol_flags(args: argparse.Namespace, names: Any) -> list[str]:
    """The flags that pass the settings `names` of `args` on to `vpo run`."""
    flags: list[str] = []
    for name in names:
        flags += [setting_flag(name), str(getattr(args, name))]
    return flags


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}".replace("e-0", "e-")  # 1e-6, not 1e-06
    return str(value)


def setting_flag(name: str) -> str:
    """The flag of setting `name`: `--lr` for learning_rate, `--group-size` for group_size,
    `--no-shared-prompt` for a switch that is on by default."""
    field = SETTING_FLAGS[name]
    negated = field.default is True
    return field.metadata["flag"] or ("--no-" if negated else "--") + name.replace("_", "-")


def given_settings(args: argparse.Namespace, names: Any) -> dict[str, Any]:
    """The settings among `names` whose flags were given."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"port {value} is not between 1 and 65535")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive whole number, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def row_count(text: str) -> int:
    value = positive_int(text)
    if value > MAX_ROWS:  # more than any table shows; SQLite cannot bind past 2^63 at all
        raise argparse.ArgumentTypeError(f"-n is at most {MAX_ROWS}, not {value}")
    return value


def descendant_count(text: str) -> int:
    value = positive_int(text)
    if value > MAX_DESCENDANTS:
        raise argparse.ArgumentTypeError(f"-n is at most {MAX_DESCENDANTS}, not {value}")
    return value


def k_count(text: str) -> int:
    value = positive_int(text)
    if value > MAX_K:
        raise argparse.ArgumentTypeError(f"--k is at most {MAX_K}, not {value}")
    return value


def program_id(text: str) -> int:
    from harness.store.models import MAX_ID

    value = positive_int(text)
    if value > MAX_ID:  # no row has it, and the SQLite driver cannot even bind it
        raise argparse.ArgumentTypeError(f"no program can have id {value} (ids end at 2^63 - 1)")
    return value
