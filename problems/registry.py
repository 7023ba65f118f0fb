"""Find problems: installed ones by entry point (group `vpo.problems`), or a folder with problem.py.

An installed package registers `name = "package.module:factory"` under
`[project.entry-points."vpo.problems"]`, where the factory returns a Problem. A folder holds a
`problem.py` that defines either `problem` (a Problem instance) or `make_problem()`.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path

from problems.api import AnswerProblem, Problem

AnyProblem = Problem | AnswerProblem

GROUP = "vpo.problems"


class ProblemLoadError(Exception):
    """A problem could not be found or loaded; the message is one line for the user."""


def available() -> dict[str, str]:
    """Installed problem names and the entry point each loads."""
    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


def load(spec: str) -> AnyProblem:
    """A problem by registered name (`name:argument` passes the argument to its factory, as in
    `humaneval:12`), or from a folder (or its problem.py) on disk."""
    path = Path(spec)
    if path.exists() or "/" in spec or spec.startswith("."):
        return _load_folder(path)
    name, _, argument = spec.partition(":")
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        known = ", ".join(sorted(available())) or "none"
        raise ProblemLoadError(
            f"unknown problem {name!r} (installed: {known}); or give a folder holding problem.py"
        )
    try:
        factory = found[0].load()
    except Exception as exc:  # a broken third-party package must not crash the CLI
        raise ProblemLoadError(f"problem {name!r} failed to load: {_one_line(exc)}") from None
    if ":" in spec:
        return _validated(_call_factory(factory, spec, argument), spec)
    return _validated(_call_factory(factory, spec), spec)


def _load_folder(path: Path) -> AnyProblem:
    file = path / "problem.py" if path.is_dir() else path
    if not file.is_file():
        raise ProblemLoadError(f"{path} is not a problem folder: it has no problem.py")
    module_name = f"vpo_user_problem_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ProblemLoadError(f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ProblemLoadError(f"could not load {file}: {_one_line(exc)}") from None
    if isinstance(getattr(module, "problem", None), Problem | AnswerProblem):
        return _validated(module.problem, str(file))
    if callable(getattr(module, "make_problem", None)):
        return _validated(_call_factory(module.make_problem, str(file)), str(file))
    raise ProblemLoadError(f"{file} defines neither `problem` (a Problem) nor `make_problem()`")


def _call_factory(factory: object, where: str, *argument: str) -> AnyProblem:
    if argument and (isinstance(factory, Problem | AnswerProblem) or not callable(factory)):
        raise ProblemLoadError(f"problem {where!r}: this problem takes no argument after ':'")
    try:
        if callable(factory) and not isinstance(factory, Problem | AnswerProblem):
            problem = factory(*argument)
        else:
            problem = factory
    except TypeError as exc:
        if argument and "positional argument" in str(exc):
            raise ProblemLoadError(
                f"problem {where!r}: this problem takes no argument after ':'"
            ) from None
        raise ProblemLoadError(f"problem factory in {where} failed: {_one_line(exc)}") from None
    except Exception as exc:
        if argument:  # the factory refused its argument (`humaneval:999`): say which
            raise ProblemLoadError(f"problem {where!r}: {_one_line(exc)}") from None
        raise ProblemLoadError(f"problem factory in {where} failed: {_one_line(exc)}") from None
    if not isinstance(problem, Problem | AnswerProblem):
        raise ProblemLoadError(f"{where} gave a {type(problem).__name__}, not a Problem")
    return problem


def _validated(problem: AnyProblem, where: str) -> AnyProblem:
    """Catch a malformed problem definition at load time, not halfway through a campaign."""
    names = [o.name for o in getattr(problem, "objectives", ())]
    if isinstance(problem, AnswerProblem):
        for attribute in ("name", "description", "answer_tag"):
            if not isinstance(getattr(problem, attribute, None), str):
                raise ProblemLoadError(f"problem from {where}: `{attribute}` must be a string")
        if not problem.answer_tag.isidentifier():
            raise ProblemLoadError(f"problem from {where}: answer_tag must be a name")
        if not names or len(set(names)) != len(names):
            raise ProblemLoadError(f"problem from {where} needs distinct objective names")
        return problem
    for attribute in ("name", "description", "seed_program", "entry"):
        if not isinstance(getattr(problem, attribute, None), str):
            raise ProblemLoadError(f"problem from {where}: `{attribute}` must be a string")
    if not problem.entry.isidentifier():
        raise ProblemLoadError(f"problem from {where}: entry {problem.entry!r} is not a name")
    driver_entry = getattr(problem, "driver_entry", "")
    if driver_entry and (not driver_entry.isidentifier() or not problem.driver):
        raise ProblemLoadError(
            f"problem from {where}: driver_entry {driver_entry!r} needs a name and a driver"
        )
    referee, referee_entry = getattr(problem, "referee", ""), getattr(problem, "referee_entry", "")
    if bool(referee) != bool(referee_entry) or (referee and not referee_entry.isidentifier()):
        raise ProblemLoadError(
            f"problem from {where}: a referee needs referee_entry, a name ({referee_entry!r})"
        )
    if not names:
        raise ProblemLoadError(f"problem from {where} has no objectives")
    if len(set(names)) != len(names):
        raise ProblemLoadError(f"problem from {where} repeats an objective name: {names}")
    covered: list[str] = []
    for call in problem.calls():
        unknown = set(call.objectives) - set(names)
        if unknown:
            raise ProblemLoadError(
                f"problem from {where}: call {call.key!r} scores unknown objectives "
                f"{sorted(unknown)}"
            )
        covered.extend(call.objectives)
    if sorted(covered) != sorted(names):
        raise ProblemLoadError(
            f"problem from {where}: every objective must be scored by exactly one call"
        )
    return problem


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0] if text else type(exc).__name__
