"""The candidate's file system holds only what a Python program needs (issue 44, item 4).

A red team found another copy of LLM-SR's data elsewhere on the disk and scored NMSE 0: hiding
listed paths cannot work. Here files holding oscillator1's test targets are planted in the home
folder, /home, the host's /tmp, /opt, /srv, a /work/shared-like folder beside the checkout and the
folder above the checkout, and a candidate of each kind the sandbox runs tries to read them (and
the real shared copy, where this machine has one), at module level and inside its entry point:
a plain entry program (circle packing), driven heuristics (cap set, bin packing: the driver is
appended to the program) and equation discovery's two stages (behind its grammar, which refuses
such a program before it runs). None reads anything, and the equation program, which would
answer the test inputs with the targets it read, scores what it scores with nothing planted;
with the namespaces off, the same programs read them (the probe works). An honest candidate
still imports numpy and scipy.optimize, `/` lists only the allowed entries, and a walk of the
whole root finds no regular file outside the libraries but the loader's cache and pyvenv.cfg.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import AsWritten, as_nobody, missing_isolation, needs_isolation, python_for_nobody

from harness.evaluation import view, zygote
from harness.evaluation.calls import default_private_paths
from harness.evaluation.evaluate import evaluate
from harness.evaluation.sandbox import Sandbox
from problems.api import Evaluation, Problem
from problems.bin_packing import BinPacking
from problems.cap_set import CapSet
from problems.circle_packing import CirclePacking
from problems.equation_discovery import DATA, EquationDiscovery

PROJECT = Path(__file__).resolve().parents[1]
ROOT = os.geteuid() == 0
SHARED_COPY = Path("/work/shared/data/llm-sr/oscillator1/test_id.csv")  # where the red team looked
# What `/` may hold besides the folders on the way to the interpreter (its prefix, a venv).
SYSTEM_TOP = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc"}
SYSTEM_TOP |= {"tmp", "var"}
NEVER_TOP = {"home", "opt", "srv", "mnt", "media", "boot", "run", "sys", "work", "root"}


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(workers=2) as box:
        yield box


@pytest.fixture(scope="module")
def planted() -> Iterator[list[str]]:
    """Files holding oscillator1's test targets (x, v, a as CSV) in every kind of place outside
    the candidate's root, readable to every user; removed afterwards."""
    token = f"vpo-view-{uuid.uuid4().hex[:8]}"
    with np.load(DATA / "oscillator1.npz") as stored:
        table = stored["test_id"]
    places = [
        (Path.home(), f"{token}-home.csv"),  # the harness user's home
        (Path("/home"), f"{token}-users/test_id.csv"),
        (Path("/tmp"), f"{token}-tmp/test_id.csv"),  # the host's; each candidate has its own
        (Path("/opt"), f"{token}-opt/llm-sr/oscillator1/test_id.csv"),
        (Path("/srv"), f"{token}-srv/test_id.csv"),
        # a shared-like folder and a file beside the checkout (which may itself lie in /tmp)
        (PROJECT.parent, f"{token}-shared/data/llm-sr/oscillator1/test_id.csv"),
        (PROJECT.parent, f"{token}-above.csv"),
    ]
    made: list[Path] = []
    files = []
    try:
        for folder, relative in places:
            if not folder.is_dir() or not os.access(folder, os.W_OK):
                continue
            path = folder / relative
            top = folder / Path(relative).parts[0]
            made.append(top)
            for parent in reversed(path.relative_to(folder).parents[:-1]):
                (folder / parent).mkdir()
                (folder / parent).chmod(0o755)
            np.savetxt(path, table, delimiter=",")
            path.chmod(0o644)
            files.append(str(path))
        assert len(files) >= 5, files
        yield files
    finally:
        for top in made:
            if top.is_dir():
                shutil.rmtree(top)
            elif top.exists():
                top.unlink()


def probe(planted: list[str]) -> str:
    """Code that reads every planted file (and the real shared copy) it can, once per process
    and place (module level, or inside the entry point), printing what it read."""
    paths = [*planted, str(SHARED_COPY)]
    return textwrap.dedent(
        f"""
        _VPO_PLANTED = {paths!r}
        _VPO_READ = {{}}


        def _vpo_probe(where):
            if where in _VPO_READ:
                return
            read = {{}}
            for path in _VPO_PLANTED:
                try:
                    with open(path) as handle:
                        read[path] = handle.read()
                except OSError:
                    pass
            _VPO_READ[where] = read
            print(f"read at {{where}}:", sorted(read), flush=True)


        _vpo_probe("module level")
        """
    )


def attempts(planted: list[str], problem: Problem, code: str) -> str:
    """`code` with the probe in front and its entry point wrapped, so it reads inside it too."""
    entry = problem.entry
    wrapper = f"""
_vpo_{entry} = {entry}


def {entry}(*args, **kwargs):
    _vpo_probe("inside {entry}")
    return _vpo_{entry}(*args, **kwargs)
"""
    return probe(planted) + code + wrapper


def equation_attack(planted: list[str]) -> str:
    """A valid `equation` program that answers the inputs of any table it read with its
    targets, and gives the seed's formula elsewhere."""
    return probe(planted) + textwrap.dedent(
        """
        import io

        import numpy as np


        def _vpo_table(text):
            for skip in (0, 1):  # a header line or none
                try:
                    rows = np.loadtxt(io.StringIO(text), delimiter=",", skiprows=skip, ndmin=2)
                except ValueError:
                    continue
                return rows if rows.shape[1] == 3 else None
            return None


        TABLES = [_vpo_table(text) for text in _VPO_READ["module level"].values()]


        def equation(x, v, params):
            _vpo_probe("inside equation")
            for table in TABLES:
                if (
                    table is not None
                    and len(table) == len(x)
                    and np.array_equal(x, table[:, 0])
                    and np.array_equal(v, table[:, 1])
                ):
                    return table[:, 2].copy()
            return params[0] * x + params[1] * v + params[2]
        """
    )


def read_lines(evaluation: Evaluation) -> list[str]:
    lines = []
    for call in evaluation.artifacts.values():
        lines += [line for line in call["stdout"].splitlines() if line.startswith("read at ")]
    return lines


def readable_to_others(path: str) -> bool:
    """Whether a candidate's uid could read `path` with nothing hidden: a root harness's
    candidates run as other uids, whom a private home (0700) keeps out anyway."""
    folder = os.path.dirname(path)
    return zygote._first_untraversable(folder, None) is None and bool(os.stat(path).st_mode & 4)


KINDS = {
    "plain entry (circle packing)": CirclePacking,
    "driven heuristic (cap set)": CapSet,
    "driven heuristic (bin packing)": BinPacking,
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_no_candidate_reads_a_copy_of_the_data(
    sandbox: Sandbox, planted: list[str], kind: str
) -> None:
    problem = KINDS[kind]()
    code = attempts(planted, problem, problem.seed_program)
    evaluation = evaluate(problem, code, sandbox)
    assert evaluation.status == "ok", evaluation.reason
    lines = read_lines(evaluation)
    calls = len(evaluation.artifacts)
    assert lines.count("read at module level: []") == calls, lines
    assert lines.count(f"read at inside {problem.entry}: []") == calls, lines
    assert len(lines) == 2 * calls


def test_equation_discovery_reads_nothing_in_either_stage(
    sandbox: Sandbox, planted: list[str]
) -> None:
    """The problem's grammar refuses the program before any process starts; with the grammar
    taken away (`AsWritten`) it runs as written, and both stages (the fit, then the predictions
    in a fresh process) read nothing: it scores exactly what it scores with nothing planted."""
    refused = evaluate(EquationDiscovery("oscillator1"), equation_attack(planted), sandbox)
    assert refused.status == "invalid" and "refused before running" in str(refused.reason)
    problem = AsWritten("oscillator1")
    evaluation = evaluate(problem, equation_attack(planted), sandbox)
    honest = evaluate(problem, equation_attack([]), sandbox)
    assert evaluation.status == honest.status == "ok", (evaluation.reason, honest.reason)
    assert set(evaluation.artifacts) == {"fit", "predict"}
    for stage in ("fit", "predict"):
        stdout = evaluation.artifacts[stage]["stdout"]
        assert "read at module level: []" in stdout, stdout
        assert "read at inside equation: []" in stdout, stdout
        assert ": ['" not in stdout, stdout
    assert evaluation.scores == honest.scores


def test_with_nothing_isolated_the_same_programs_read_the_copies(planted: list[str]) -> None:
    """The control: without namespaces the probe reads every copy a candidate's uid may, at
    module level and inside the entry point. (The equation program's fit goes no further here
    when the interpreter lives in root's private home, as with pyenv: without a mount namespace
    nothing lets the candidate's uid import what numpy did not preload.)"""
    expected = sorted(path for path in planted if readable_to_others(path))
    if SHARED_COPY.is_file() and readable_to_others(str(SHARED_COPY)):
        expected = sorted([*expected, str(SHARED_COPY)])
    assert len(expected) >= 4, expected
    with Sandbox(workers=2, namespaces=False) as exposed:
        packing = CirclePacking()
        shown = evaluate(packing, attempts(planted, packing, packing.seed_program), exposed)
        fitted = evaluate(AsWritten("oscillator1"), equation_attack(planted), exposed)
    stdout = shown.artifacts["n26"]["stdout"]
    assert f"read at module level: {expected}" in stdout
    assert f"read at inside construct_packing: {expected}" in stdout
    assert f"read at module level: {expected}" in fitted.artifacts["fit"]["stdout"]


def test_an_honest_candidate_imports_numpy_and_scipy(sandbox: Sandbox) -> None:
    code = textwrap.dedent(
        """
        import numpy as np
        import scipy.optimize

        def f():
            found = scipy.optimize.minimize(lambda x: float(np.sum((x - 3.0) ** 2)), np.zeros(2))
            return [round(float(value), 4) for value in found.x]
        """
    )
    outcome = sandbox.run(code, "f")
    assert outcome.status == "ok", (outcome.reason, outcome.stderr)
    assert outcome.value == [3.0, 3.0]
    if "minimal-root" not in outcome.isolation:
        missing_isolation(f"this OS refused a root of the candidate's own: {outcome.warnings}")


WALK = """
import os, sys

def f():
    listings = {}
    for folder in ("/", "/etc", "/var", "/dev", "/usr", "/usr/share"):
        try:
            listings[folder] = sorted(os.listdir(folder))
        except OSError as exc:
            listings[folder] = type(exc).__name__
    # every file outside the libraries: the interpreter's folders, /usr, /proc and /dev
    libraries = {os.path.realpath(entry) for entry in sys.path if entry}
    prefix = os.path.realpath(sys.base_prefix)
    libraries |= {"/usr", "/proc", "/dev", prefix + "/lib", prefix + "/bin"}
    files = []
    for folder, folders, names in os.walk("/"):
        folders[:] = [name for name in folders if os.path.join(folder, name) not in libraries]
        for name in names:
            path = os.path.join(folder, name)
            files.append([path, os.path.islink(path)])
    interpreter = [sys.executable, sys.prefix, sys.base_prefix, *sys.path]
    tops = {path.split("/")[1] for path in interpreter if path.startswith("/")}
    tops |= {os.path.realpath(path).split("/")[1] for path in interpreter if path.startswith("/")}
    return [listings, files, sys.prefix, sorted(tops)]
"""


def test_the_root_holds_only_what_python_needs(sandbox: Sandbox, planted: list[str]) -> None:
    outcome = sandbox.run(WALK, "f")
    assert outcome.status == "ok", (outcome.reason, outcome.stderr)
    if "minimal-root" not in outcome.isolation:
        missing_isolation(f"this OS refused a root of the candidate's own: {outcome.warnings}")
    listings, files, prefix, tops = outcome.value
    on_the_way = set(tops) - {""}  # the top folders of the interpreter's paths
    assert set(listings["/"]) <= SYSTEM_TOP | on_the_way, listings["/"]
    assert not set(listings["/"]) & (NEVER_TOP - on_the_way)
    assert set(listings["/etc"]) <= {"ld.so.cache", "alternatives"}
    assert listings["/var"] == ["tmp"]
    assert set(listings["/dev"]) <= {"null", "zero", "random", "urandom", "shm", "fd"} | {
        "stdin",
        "stdout",
        "stderr",
    }
    assert listings["/usr/share"] == ["zoneinfo"]
    assert not set(listings["/usr"]) & {"src", "include", "games"}
    # no regular file but the loader's cache and the venv's configuration; the rest are links
    regular = {path for path, link in files if not link}
    expected = {"/etc/ld.so.cache", "/etc/alternatives/README", os.path.join(prefix, "pyvenv.cfg")}
    assert regular <= expected, regular
    assert not any(Path(path).name == Path(planted[0]).name for path, _ in files)


def test_a_private_checkout_is_empty_but_for_its_virtual_environment(sandbox: Sandbox) -> None:
    code = textwrap.dedent(
        f"""
        import os

        def f():
            try:
                return sorted(os.listdir({str(PROJECT)!r}))
            except OSError as exc:
                return type(exc).__name__
        """
    )
    outcome = sandbox.run(code, "f")
    venv = Path(sys.prefix).resolve()
    inside = venv.relative_to(PROJECT).parts[0] if venv.is_relative_to(PROJECT) else None
    assert outcome.value == ([inside] if inside else "FileNotFoundError")


def test_the_plan_shows_no_private_folder_but_the_interpreters() -> None:
    private = view.plan(default_private_paths())
    interpreter = [os.path.realpath(entry) for entry in sys.path if entry]
    interpreter += [os.path.realpath(os.path.join(sys.prefix, "pyvenv.cfg"))]
    for path in private.shown:
        if path.startswith(str(PROJECT) + "/"):
            assert path in interpreter or path.startswith(str(Path(sys.prefix).resolve())), path
        assert not any(path.startswith(f"/{top}/") for top in ("home", "opt", "srv", "mnt"))
    # with nothing private, the packages an editable install maps are libraries like any other
    packages = str(PROJECT / "problems")
    if packages in view._editable_packages():  # shown, or inside a folder shown (sys.path's)
        assert view.in_sight(view.plan(()), [packages])


def test_where_the_os_refuses_a_root_of_its_own_the_outcome_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork server whose kernel refuses the new root (here a copy whose `view.enter` fails as
    such a kernel would) falls back to the read-only view of every mount, private paths covered,
    and every outcome says so."""
    from harness.evaluation import slot

    shutil.copy(zygote.__file__, tmp_path / "zygote.py")
    refusing = textwrap.dedent(
        """

        def enter(plan, fresh_proc, warnings):
            raise OSError(errno.EPERM, "pivot_root and chroot refused (a test)")
        """
    )
    (tmp_path / "view.py").write_text(Path(view.__file__).read_text() + refusing)
    monkeypatch.setattr(slot, "_ZYGOTE", tmp_path / "zygote.py")
    data = PROJECT / "problems" / "equation_discovery" / "data" / "oscillator1.npz"
    code = textwrap.dedent(
        f"""
        import os

        def f():
            try:
                open({str(data)!r}, "rb")
                found = "read"
            except OSError as exc:
                found = type(exc).__name__
            return [found, sorted(os.listdir("/"))]
        """
    )
    with Sandbox(workers=1) as box:
        outcome = box.run(code, "f")
    assert outcome.status == "ok", (outcome.reason, outcome.stderr)
    if "mount-namespace" not in outcome.isolation:
        missing_isolation(f"no mount namespace here: {outcome.warnings}")
    assert "minimal-root" not in outcome.isolation
    assert any(
        warning.startswith("every world-readable file is readable to the candidate")
        and "refused (a test)" in warning
        for warning in outcome.warnings
    ), outcome.warnings
    assert {"private-paths-hidden", "read-only-filesystem"} <= set(outcome.isolation)
    found, top = outcome.value
    assert found == "FileNotFoundError"
    assert "usr" in top and "proc" in top


def test_another_checkout_an_editable_install_maps_is_private_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness may run from one checkout (PYTHONPATH) while an editable install maps the
    packages to another: the fork server, started without PYTHONPATH, follows the install's
    finder, and its root would show that checkout's packages, data and all, were they not
    private as well."""
    other = tmp_path / "other-checkout"
    (other / "problems").mkdir(parents=True)
    (other / "problems" / "__init__.py").write_text("")
    (other / "pyproject.toml").write_text("")

    class EditableFinder:
        @staticmethod
        def find_spec(name: str, path: object = None, target: object = None) -> object:
            if name != "problems":
                return None
            init = other / "problems" / "__init__.py"
            folders = [str(other / "problems")]
            return importlib.util.spec_from_file_location(
                name, init, submodule_search_locations=folders
            )

    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, EditableFinder])
    hidden = default_private_paths()
    assert {str(other.resolve()), str(other.resolve() / "problems")} <= set(hidden)
    assert str(PROJECT / "problems") in hidden


def test_symlinks_on_the_way_are_rebuilt(tmp_path: Path) -> None:
    (tmp_path / "real" / "lib").mkdir(parents=True)
    (tmp_path / "real" / "lib" / "libx.so").write_text("")
    (tmp_path / "usr").symlink_to("real")
    (tmp_path / "lib64").symlink_to(tmp_path / "usr" / "lib")
    links: dict[str, str] = {}
    found = view._resolve(str(tmp_path / "lib64" / "libx.so"), links)
    assert found == str(tmp_path.resolve() / "real" / "lib" / "libx.so")
    assert links[str(tmp_path / "lib64")] == str(tmp_path / "usr" / "lib")
    assert links[str(tmp_path.resolve() / "usr")] == "real"
    assert view._resolve(str(tmp_path / "missing"), {}) is None
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert view._resolve(str(loop), {}) is None
    assert view._outermost(["/usr/lib/x", "/usr/lib-extra", "/usr/lib", "/usr"]) == ["/usr"]
    assert view._outermost(["/usr/lib/x", "/usr/lib-extra", "/usr/lib"]) == [
        "/usr/lib",
        "/usr/lib-extra",
    ]


@needs_isolation(ROOT, "needs root to start the harness as another user")
def test_a_harness_without_privileges_builds_the_same_root(planted: list[str]) -> None:
    """A user namespace stands in for root: the same root of its own, the same files unread."""
    python = python_for_nobody()
    if python is None:
        missing_isolation("no Python here that an unprivileged user may run")
    code = probe(planted) + "def f():\n    return sorted(__import__('os').listdir('/'))\n"
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(PROJECT)!r})
        from harness.evaluation.sandbox import Sandbox
        code = {code!r}
        with Sandbox(workers=1, preload=()) as sandbox:
            outcome = sandbox.run(code, "f")
        print(json.dumps([outcome.status, outcome.value, outcome.stdout, outcome.isolation,
                          outcome.warnings]))
        """
    )
    result = as_nobody([python, "-c", script])
    assert result.returncode == 0, result.stderr
    status, top, stdout, isolation, warnings = json.loads(result.stdout)
    if "user-namespace" not in isolation:
        missing_isolation(f"user namespaces are not allowed here: {warnings}")
    assert status == "ok" and "minimal-root" in isolation, warnings
    assert "read at module level: []" in stdout
    assert not set(top) & {"home", "opt", "srv", "mnt", "work", "root"}, top
