"""Setting values: how a setting is declared (`setting`, with its flag and help), the ranges of
the float settings, the checks that name a bad value in one line, the "did you mean" hint, and
TOML writing of a value."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from dataclasses import field
from typing import Any

from harness.config.errors import UserError

# The groups of flags in `vpo run --help`.
SETTINGS = "settings (override the config file and the stored campaign)"
TRAINING = "training (VPO inside the campaign)"
REPORTING = "reporting and budgets (run settings: change them freely on resume)"

POSITIVE_FLOATS = ("price_prompt", "price_completion", "max_cost")
MAX_POSITIVE = 1e12

# Every float setting's range, checked in one place (`check_float`): (low, high, whether low
# itself is allowed, the range in words). NaN and infinity are outside every range; TOML
# writes them `nan` and `inf`, and they would pass a bare `>= 0`. The upper ends keep values
# usable downstream: the sandbox turns time_limit into an integer rlimit, and a Dirichlet
# alpha past about 1e30 draws NaN weights (beyond 1e6 the draws are uniform anyway).
FLOAT_RANGES: dict[str, tuple[float, float, bool, str]] = {
    "temperature": (0.0, 5.0, True, "a number from 0 to 5"),
    "top_p": (0.0, 1.0, False, "a number in (0, 1]"),
    "time_limit": (0.0, 86400.0, True, "a number of seconds from 0 to 86400 (0: the problem's)"),
    "learning_rate": (0.0, 1.0, False, "a number in (0, 1]"),
    "kl_beta": (0.0, 100.0, True, "a number from 0 to 100"),
    "slot_cost": (0.0, 10.0, True, "a number from 0 to 10 (0: off)"),
    "kl_budget": (0.0, 100.0, False, "a number in (0, 100]"),
    "dirichlet_alpha": (0.0, 1e6, False, "a number in (0, 1e6]"),
    "near_duplicate": (0.0, 1.0, False, "a number in (0, 1] (1: off)"),
}


def setting(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    short: str | None = None,
    group: str = SETTINGS,
    campaign_only: bool = False,
) -> Any:
    """A setting that the commands take as a flag: `--name-with-dashes` (or `flag`, and `short`
    beside it; a switch that is on by default is `--no-name`), shown in the help under `group`
    with `help`, in which `{default}` stands for the default. A training setting that only a
    campaign's loop reads is `campaign_only`: `vpo train` has no flag for it. A field made
    without this has no flag (a file or the stored campaign sets it)."""
    metadata = {
        "help": help, "flag": flag, "short": short, "group": group, "campaign_only": campaign_only,
    }  # fmt: skip
    return field(default=default, metadata=metadata)


def nearest(name: str, known: Iterable[str], shown: str = "{!r}") -> str:
    """A hint naming the known name closest to `name` ("did you mean"), else all of them."""
    known = list(known)
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return f"; did you mean {shown.format(close[0])}?"
    return f" (known: {', '.join(shown.format(k) for k in known)})"


def list_of_names(key: str, value: Any) -> tuple[str, ...]:
    """A list setting from a TOML list, the stored JSON list or a flag's "a,b" string; "none"
    stands for the empty list."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise UserError(f"config key {key!r} must be a list of names, got {value!r}")
    names = [v.strip() for v in value if v.strip()]
    return tuple(dict.fromkeys(n for n in names if n != "none"))


def check_positive(key: str, value: Any) -> float | None:
    """`value` when unset (None) or a finite number > 0, else a UserError naming the setting."""
    if value is None:
        return None
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= MAX_POSITIVE
    )
    if not ok:
        raise UserError(
            f"config key {key!r} must be a number > 0 (at most {MAX_POSITIVE:g}), got {value!r}; "
            "leave it out for none"
        )
    return float(value)


def check_float(key: str, value: Any, *, name: str | None = None) -> float:
    """`value` when it lies in FLOAT_RANGES[key], else a UserError naming the setting (as
    `name`, a flag say, when given)."""
    low, high, low_allowed, allowed = FLOAT_RANGES[key]
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (low <= value if low_allowed else low < value)
        and value <= high
    )
    if not ok:
        raise UserError(f"{name or f'config key {key!r}'} must be {allowed}, got {value!r}")
    return float(value)


def require(ok: bool, key: str, allowed: str) -> None:
    if not ok:
        raise UserError(f"config key {key!r} must be {allowed}")


def toml_value(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
