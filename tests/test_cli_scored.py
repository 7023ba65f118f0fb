"""What `vpo eval` and `vpo db show` say was scored (issue 56): the program the sandbox ran, what
a stage handed to the next (equation discovery's fitted constants), and the stage an error came
from. Real subprocesses, real sandbox, real database."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from problems.equation_discovery import dataset

# A compact candidate as a model writes it: the harness reads the expression and writes the
# program that runs, so the program shown is not the file's text.
EXPRESSION = "params[0] * x  +  params[1]*v**3   # spacing and a comment\n"
WRITTEN = (
    "import numpy as np\n\n\n"
    "def equation(x, v, params):\n"
    '    """Acceleration."""\n'
    "    return params[0] * x + params[1] * v ** 3\n"
)
OSCILLATOR = "equation_discovery:oscillator1"
OLD_DATABASE = Path(__file__).parent / "data" / "before-alembic.db"


def vpo(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as a pipe gets it: natural widths, whatever `COLUMNS` the shell exported."""
    env = {name: value for name, value in os.environ.items() if name != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def eval_json(problem: str, file: Path, status: int = 0) -> dict:
    result = vpo("eval", problem, str(file), "--json")
    assert result.returncode == status, result.stderr
    return json.loads(result.stdout)


def assert_fitted(returned: dict) -> list[float]:
    """The fit's answer as the harness kept it: ten finite constants and the training MSE."""
    assert set(returned) == {"fit"}
    assert set(returned["fit"]) == {"params", "training_mse"}
    params = returned["fit"]["params"]
    assert len(params) == 10 and all(isinstance(p, float) and np.isfinite(p) for p in params)
    assert isinstance(returned["fit"]["training_mse"], float)
    return params


def test_eval_shows_the_program_the_harness_wrote_and_the_constants_it_fitted(
    tmp_path: Path,
) -> None:
    file = tmp_path / "expression.py"
    file.write_text(EXPRESSION)
    report = eval_json(OSCILLATOR, file)
    assert report["status"] == "ok"
    assert report["program"] == WRITTEN and report["rewritten"] is True
    params = assert_fitted(report["returned"])
    # They are the constants scored: the equation with them has the training MSE reported.
    train = dataset("oscillator1")["train"]
    x, v = train.inputs[:, 0], train.inputs[:, 1]
    mse = float(np.mean((params[0] * x + params[1] * v**3 - train.target) ** 2))
    assert mse == pytest.approx(report["returned"]["fit"]["training_mse"], rel=1e-9)
    assert params[2:] == [1.0] * 8  # the constants the equation does not use keep their start

    table = vpo("eval", OSCILLATOR, str(file))
    assert table.returncode == 0, table.stderr
    wrote = "program the sandbox ran, as the problem wrote it, followed by the problem's driver:"
    assert table.stdout.startswith(f"{wrote}\n")  # first what ran, last the status
    assert "6     return params[0] * x + params[1] * v ** 3\n" in table.stdout
    reported = report["returned"]["fit"]["training_mse"]
    shown = f"fit returned: params [{params[0]:.6g}, {params[1]:.6g}, 1, 1, 1, 1, 1, 1, 1, 1]"
    assert f"{shown}, training_mse {reported:.6g}\nstatus: ok\n" in table.stdout


def test_eval_of_a_program_run_as_written_says_so(tmp_path: Path) -> None:
    from problems.circle_packing import SEED_PROGRAM

    file = tmp_path / "seed.py"
    file.write_text(SEED_PROGRAM)
    report = eval_json("circle_packing", file)
    assert report["program"] == SEED_PROGRAM and report["rewritten"] is False
    assert report["returned"] == {}  # one stage a call: nothing handed on
    table = vpo("eval", "circle_packing", str(file))
    assert table.stdout.startswith("program: run as written\n")
    assert "returned" not in table.stdout


def test_eval_of_a_refused_candidate_ran_no_program(tmp_path: Path) -> None:
    file = tmp_path / "refused.py"
    file.write_text("np.polyval(params, x)\n")
    report = eval_json(OSCILLATOR, file, status=1)
    assert report["reason"].startswith("refused before running: ")
    assert report["program"] is None and report["rewritten"] is None and report["returned"] == {}


TWO_STAGES = """\
from problems.api import Call, Objective, Problem


class TwoStages(Problem):
    name = "two stages"
    description = "first hands a number on; second, in a fresh process, returns it"
    seed_program = "def first():\\n    return 42\\n\\n\\ndef second(n):\\n    return n / 1\\n"
    entry = "first"
    objectives = (Objective("value", "max", 42.0, "by definition"),)

    def follow_up(self, call, value, code):
        if call.key == "second":
            return None
        return Call("second", (value,), call.objectives, entry="second")

    def score(self, call, value):
        return {"value": float(value)}


problem = TwoStages()
"""


@pytest.mark.parametrize(
    "problem,program,label,handed_on",
    [
        # a user's problem of two stages whose second raises: not "main: ZeroDivisionError"
        (
            "two_stages",
            "def first():\n    return 42\n\n\ndef second(n):\n    return n / 0\n",
            "second: ZeroDivisionError: division by zero",
            {"main": 42},
        ),
        # equation discovery: finite on the training inputs, NaN where x > 0.6 out of domain
        (
            OSCILLATOR,
            "params[0] * x + params[1] * np.sqrt(0.6 - x)\n",
            "predict: test_ood: 4292 of 10000 predictions are not finite",
            "fit",
        ),
        # and the fit's own failure is still the fit's
        (
            OSCILLATOR,
            "params[0] * np.sqrt(-1.0 - x)\n",
            "fit: ValueError: the fitted equation's training error is not finite",
            {},
        ),
    ],
)
def test_an_error_names_the_stage_that_raised_it(
    tmp_path: Path, problem: str, program: str, label: str, handed_on: object
) -> None:
    if problem == "two_stages":
        folder = tmp_path / problem
        folder.mkdir()
        (folder / "problem.py").write_text(TWO_STAGES)
        problem = str(folder)
    file = tmp_path / "candidate.py"
    file.write_text(program)
    report = eval_json(problem, file, status=1)
    assert report["reason"].startswith(label), report["reason"]
    if handed_on == "fit":
        assert_fitted(report["returned"])
    else:
        assert report["returned"] == handed_on
    table = vpo("eval", problem, str(file))
    assert f"({label}" in table.stdout


def test_db_show_prints_the_program_that_ran_and_the_constants_stored_with_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "campaign.db"
    run = vpo("run", OSCILLATOR, "--db", str(db), "--iterations", "0")  # the seed, evaluated
    assert run.returncode == 0, run.stderr
    shown = json.loads(vpo("db", "show", "--db", str(db), "1", "--json").stdout)
    params = assert_fitted(shown["returned"])
    assert shown["metrics"]["artifacts"]["fit"]["returned"] == shown["returned"]["fit"]
    assert "def equation(x, v, params):" in shown["code"]
    table = vpo("db", "show", "--db", str(db), "1").stdout
    assert f"\nfit returned: params [{params[0]:.6g}, " in table
    assert "\nprogram as the sandbox ran it:\n1 import numpy as np\n" in table
    assert "not recorded" not in table


def test_db_show_of_a_program_stored_before_the_constants_were_kept_says_so(
    tmp_path: Path,
) -> None:
    """A database of equation discovery written before these were kept: its seed scored, so
    its fit returned constants, and the view says they were not recorded."""
    db = tmp_path / "old.db"
    shutil.copy(OLD_DATABASE, db)
    with sqlite3.connect(db) as old:
        assert old.execute("SELECT problem FROM campaign").fetchone() == (OSCILLATOR,)
    seed = json.loads(vpo("db", "show", "--db", str(db), "1", "--json").stdout)
    assert seed["status"] == "ok" and seed["returned"] is None
    table = vpo("db", "show", "--db", str(db), "1").stdout
    assert "\nwhat its earlier stages returned (a fit's constants) was not recorded" in table
    # a program whose fit raised returned nothing: nothing is missing
    failed = json.loads(vpo("db", "show", "--db", str(db), "2", "--json").stdout)
    assert failed["status"] == "error" and failed["returned"] == {}
    assert "not recorded" not in vpo("db", "show", "--db", str(db), "2").stdout


# What is kept of a stage's data (results.kept): JSON the database stores, and bounded.


def test_kept_data_are_storable_json_whatever_a_stage_returns() -> None:
    from harness.evaluation.results import KEPT_VALUES, kept

    fit = {"params": np.array([1.5, np.nan, -np.inf]), "training_mse": np.float64(2.0)}
    assert kept(fit) == {"params": [1.5, "nan", "-inf"], "training_mse": 2.0}
    assert kept(np.arange(3, dtype=np.int32)) == [0, 1, 2] and kept(1 + 2j) == "(1+2j)"
    assert kept("a\nlong\x00 line " * 100).startswith("a long\x00 line a long")
    assert kept(np.zeros(10**7)) == f"not kept: more than {KEPT_VALUES} values"
    assert kept([[0.0] * 60, [0.0] * 60]) == f"not kept: more than {KEPT_VALUES} values"


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=500),
        lambda inner: st.lists(inner, max_size=30) | st.dictionaries(st.text(), inner),
        max_leaves=300,
    )
)
def test_kept_data_always_dump_as_strict_json(value: object) -> None:
    from harness.evaluation.results import kept

    shown = kept(value)
    json.dumps(shown, allow_nan=False)  # what the store's JSON columns accept
    assert len(json.dumps(shown)) < 30_000
