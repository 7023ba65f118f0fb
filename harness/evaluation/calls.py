"""What a sandbox call asks and gets back: the limits of one evaluation, the call, its outcome, and
the paths a candidate must not see."""

from __future__ import annotations

import importlib.util
import os
import sys
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
    cpu_seconds: float = 0.0  # the candidate process's user + system time (its rusage)


@dataclass(frozen=True)
class Referee:
    """Trusted code that makes a call in a process of its own, beside the candidate's (see
    `Sandbox.run`): the sandbox calls its function `entry` with the call's arguments, and it
    reaches the candidate's functions only through `call_candidate(name, *args)`."""

    code: str
    entry: str


@dataclass(frozen=True)
class Call:
    """One evaluation for `Sandbox.map`."""

    code: str
    entry: str
    args: tuple = ()
    limits: Limits | None = None
    private_paths: tuple[str, ...] = ()  # hidden from this call only (see `Sandbox.run`)
    referee: Referee | None = None


def default_private_paths() -> tuple[str, ...]:
    """What no candidate may read, by default: the folders of the project's packages (harness,
    problems, trainer: the problems' data, their held-out test targets and published solutions
    among them), wherever an import could find them, and, when they lie in a checkout (a folder
    with pyproject.toml, as in an editable install), the whole checkout: its examples, tests and
    git history hold the same data. A virtual environment inside the checkout stays visible, as
    the interpreter needs it. The candidate's root (view.py) holds only the system's and the
    interpreter's files, and the packages an editable install maps, as libraries: these paths
    keep the project's packages out of it, and are covered where it shows them (a non-editable
    install in site-packages).
    """
    found = set()
    for name in ("harness", "problems", "trainer"):
        for location in _package_folders(name):
            package = os.path.realpath(location)
            found.add(package)
            checkout = os.path.dirname(package)
            if checkout != "/" and os.path.isfile(os.path.join(checkout, "pyproject.toml")):
                found.add(checkout)
    return tuple(sorted(found))


def _package_folders(name: str) -> list[str]:
    """Every folder an import of package `name` could come from: the one it does, and any other
    a finder offers (an editable install of another checkout, whose finder the fork server, run
    without PYTHONPATH, would follow, and whose packages its root would then show)."""
    spec = importlib.util.find_spec(name)
    folders = list((spec and spec.submodule_search_locations) or ())
    for finder in sys.meta_path:
        try:
            other = finder.find_spec(name, None)  # type: ignore[attr-defined]
        except Exception:  # a finder without find_spec, or one that fails on this name
            continue
        folders += list((other and other.submodule_search_locations) or ())
    return folders


def existing(paths: Iterable[str]) -> list[str]:
    """Absolute, symlinks resolved (the zygote covers the real folder), only those that exist."""
    resolved = {os.path.realpath(path) for path in paths}
    return sorted(path for path in resolved if os.path.lexists(path))
