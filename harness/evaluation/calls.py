"""What a sandbox call asks and gets back: the limits of one evaluation, the call, its outcome, and
the paths a candidate must not see."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from harness.config.errors import UserError


@dataclass(frozen=True)
class Limits:
    """What one evaluation may use. Sizes are in MiB."""

    wall_seconds: float = 10.0
    cpu_seconds: float | None = None  # None: wall_seconds + 1
    memory_mb: int = 2048  # address space (RLIMIT_AS), numpy's own mappings included
    file_mb: int = 64  # largest file, stdout and stderr included (RLIMIT_FSIZE)
    max_processes: int = 32  # RLIMIT_NPROC; counted per uid, so only with a uid of its own
    output_chars: int = 4000  # tail of stdout and of stderr kept in the Outcome
    result_mb: int = 64  # largest encoded return value accepted
    open_files: int = 256  # RLIMIT_NOFILE: each can pin memory (a memfd) RLIMIT_AS does not see

    def __post_init__(self) -> None:
        names = ("wall_seconds", "memory_mb", "file_mb", "max_processes", "result_mb", "open_files")
        for name in names:
            if not getattr(self, name) > 0:
                raise UserError(f"sandbox limit {name} must be positive, not {getattr(self, name)}")
        if self.cpu_seconds is not None and not self.cpu_seconds > 0:
            raise UserError(f"sandbox limit cpu_seconds must be positive, not {self.cpu_seconds}")
        if self.output_chars < 0:
            raise UserError(f"sandbox limit output_chars must be >= 0, not {self.output_chars}")

    @property
    def cpu_limit(self) -> float:
        return self.wall_seconds + 1 if self.cpu_seconds is None else self.cpu_seconds


@dataclass(frozen=True)
class Outcome:
    """What one evaluation gave: the decoded return value, or why there is none."""

    status: Literal["ok", "error", "timeout"]
    value: Any  # the decoded return value when status == "ok", else None
    reason: str | None  # one line; None when ok
    stdout: str  # tails
    stderr: str
    seconds: float
    isolation: tuple[str, ...]  # what was applied, e.g. ("pid-namespace", "uid=61001")
    warnings: tuple[str, ...]  # what could not be, e.g. ("network not isolated: ...",)


@dataclass(frozen=True)
class Call:
    """One evaluation for `Sandbox.map`."""

    code: str
    entry: str
    args: tuple = ()
    limits: Limits | None = None
    private_paths: tuple[str, ...] = ()  # hidden from this call only (see `Sandbox.run`)


def default_private_paths() -> tuple[str, ...]:
    """What no candidate may read, by default: the folders of the project's packages (harness,
    problems, trainer: the problems' data, their held-out test targets and published solutions
    among them) and, when they run from a checkout (a folder with pyproject.toml, as in an
    editable install), the whole checkout: its examples, tests and git history hold the same
    data. A virtual environment inside the checkout stays visible, as the interpreter needs it.
    """
    found = set()
    for name in ("harness", "problems", "trainer"):
        spec = importlib.util.find_spec(name)
        for location in (spec and spec.submodule_search_locations) or ():
            package = os.path.realpath(location)
            found.add(package)
            checkout = os.path.dirname(package)
            if checkout != "/" and os.path.isfile(os.path.join(checkout, "pyproject.toml")):
                found.add(checkout)
    return tuple(sorted(found))


def existing(paths: Iterable[str]) -> list[str]:
    """Absolute, symlinks resolved (the zygote covers the real folder), only those that exist."""
    resolved = {os.path.realpath(path) for path in paths}
    return sorted(path for path in resolved if os.path.lexists(path))
