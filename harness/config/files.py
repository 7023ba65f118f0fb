"""A campaign's TOML file: its sections, and the flat settings it holds (docs/campaigns.md).

A key stands at the top of the file or in its own section; an unknown section or key, or a key
in another key's section, is refused in one line that names the nearest valid name.
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any

from harness.config.errors import UserError
from harness.config.settings import KEYS, TRAINING_KEYS
from harness.config.values import nearest as _nearest

# The sections: a key stands at the top of the file or in its own section. The keys of no
# section (problem, name, seed, ...) stand at the top only. [training] is the campaign's
# TrainSettings; the others group its flat keys for people.
SECTIONS: dict[str, tuple[str, ...]] = {
    "model": ("backend", "model", "base_url", "api_key_env"),
    "generation": (
        "concurrency", "context_tokens", "draft_chars", "feedback_chars", "retries",
        "call_timeout", "max_failures",
    ),
    "sampling": (
        "group_size", "candidates", "temperature", "top_p", "top_k", "max_tokens", "form"
    ),
    "evolution": ("islands", "migration_interval", "drafts", "near_duplicate", "parent_selection"),
    "evaluation": ("workers", "time_limit"),
    "training": tuple(TRAINING_KEYS),  # the campaign's `training`, a TrainSettings
    "reporting": ("report_to", "tracker_dir"),
    "budget": ("price_prompt", "price_completion", "max_total_tokens", "max_cost"),
}  # fmt: skip
SECTION_OF = {key: section for section, keys in SECTIONS.items() for key in keys}
if not set(SECTION_OF) <= set(KEYS) or len(SECTION_OF) != sum(map(len, SECTIONS.values())):
    raise RuntimeError(
        "harness.config.settings: SECTIONS must name each setting once, and only settings"
    )


def load_toml(path: str | Path) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise UserError(f"config file {path}: no such file")
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"config file {path} is not valid TOML: {exc}") from None
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(value, dict):
            _check_key(key, None, path)
            flat[key] = value
            continue
        if key not in SECTIONS:
            raise UserError(f"unknown section [{key}] in {path}{_nearest(key, SECTIONS, '[{}]')}")
        for inner in value:
            _check_key(inner, key, path)
        flat.update(value)
    return flat


def _check_key(key: str, section: str | None, path: str | Path) -> None:
    """A UserError unless `key` may stand in `section` (None: the top of the file)."""
    if key not in KEYS:
        where = f"{path}" if section is None else f"[{section}] of {path}"
        close = difflib.get_close_matches(key, list(KEYS), n=1)
        if close:
            hint = f"; did you mean {close[0]!r} {_place(close[0])}?"
        else:
            hint = f" (known keys: {', '.join(KEYS if section is None else SECTIONS[section])})"
        raise UserError(f"unknown key {key!r} in {where}{hint}")
    if section is not None and SECTION_OF.get(key) != section:
        raise UserError(f"key {key!r} belongs {_place(key)}, not in [{section}] of {path}")


def _place(key: str) -> str:
    """Where `key` stands in a TOML file."""
    section = SECTION_OF.get(key)
    return f"in [{section}]" if section else "at the top of the file"
