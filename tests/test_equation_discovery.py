"""Equation discovery on LLM-SR's four problems: the shipped data, the seeds fitted through the
real sandbox at LLM-SR's reference floor (score 0), a better equation well above it, `vpo eval`,
the log-scale mapping, and hostile programs, each scoring 0 with a one-line reason. Programs that
carry the targets from the fitting process to the predicting one: tests/test_target_smuggling.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import AsWritten, in_a_candidates_sight
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.evaluation.calls import Limits
from harness.evaluation.evaluate import evaluate, evaluate_many
from harness.evaluation.sandbox import Sandbox
from problems.api import MAX_SCORE, Call, Evaluation, Infeasible
from problems.equation_discovery import (
    DATA,
    MAXITER,
    NMSE_FLOOR,
    SPECS,
    EquationDiscovery,
    LogFit,
    dataset,
    earned,
)
from problems.equation_discovery.grammar import simplicity
from problems.registry import ProblemLoadError, load

ROOT = Path(__file__).parents[1]
HEADER = "import numpy as np\n\n\ndef equation(x, v, params):\n"
# Found by fitting a few skeletons to oscillator1's training data: cubic stiffness, cubic
# damping and an x*v term, four constants (NMSE 2.1e-6 in-domain, 0.030 out-of-domain).
BETTER = (
    HEADER + "    return params[0] * x + params[1] * v**3 + params[2] * x**3 + params[3] * x * v\n"
)
SEED_BODY = "    return params[0] * x + params[1] * v + params[2]\n"
# An equation the grammar accepts whose training error is not finite (log of a negative).
NOT_FINITE = HEADER + "    return params[0] * x + np.log(-1.0 - x**2)\n"
SEED_FIT = HEADER + SEED_BODY
# LLM-SR's reference floor: its initial skeletons fitted with BFGS from ones
# (the reference notes in docs/problems.md).
FLOOR = {
    "oscillator1": (0.0959, 0.863),
    "oscillator2": (0.195, 0.117),
    "bactgrow": (0.865, 1.20),
    "stressstrain": (2.60, 4.76),
}


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(workers=2) as box:
        yield box


def assert_zero_with_reason(evaluation: Evaluation, words: str) -> None:
    assert evaluation.status != "ok", evaluation
    assert set(evaluation.scores.values()) == {0.0}
    assert evaluation.reason and words in evaluation.reason, evaluation.reason
    assert "\n" not in evaluation.reason and "Traceback" not in evaluation.reason


# --- the data ---------------------------------------------------------------------------------


def test_shipped_data_are_llm_srs_csvs() -> None:
    rows = {
        "oscillator1": (10000, 10000, 10000),
        "oscillator2": (10000, 10000, 10000),
        "bactgrow": (7500, 2500, 15000),
        "stressstrain": (2161, 1442, 738),
    }
    for key, counts in rows.items():
        splits = dataset(key)
        width = len(SPECS[key].inputs)
        for split, count in zip(("train", "test_id", "test_ood"), counts, strict=True):
            assert splits[split].inputs.shape == (count, width)
            assert splits[split].target.shape == (count,)
            assert (
                np.isfinite(splits[split].inputs).all() and np.isfinite(splits[split].target).all()
            )
    # The first training row of oscillator1.csv, digit for digit: the arrays are the CSV's values.
    first = dataset("oscillator1")["train"]
    assert first.inputs[0].tolist() == [-0.2519789948114764, -0.17306600923612298]
    assert first.target[0] == 0.028552096211324336
    assert "MIT License" in (DATA / "LICENSE").read_text()


def test_the_data_travel_with_the_installed_package() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert declared["package-data"]["problems.equation_discovery"] == ["data/*.npz", "data/LICENSE"]
    assert sorted(p.name for p in DATA.glob("*.npz")) == sorted(f"{k}.npz" for k in SPECS)


def test_no_process_that_predicts_holds_a_target() -> None:
    """The fit gets the training set only; the predictions' process gets the ten constants and
    the inputs, and no array that holds or shares memory with a target of any split."""
    for key in SPECS:
        problem = EquationDiscovery(key)
        (fit,) = problem.calls()
        data = dataset(key)
        train_inputs, train_target, maxiter = fit.args
        assert train_inputs is data["train"].inputs and train_target is data["train"].target
        assert maxiter == MAXITER and fit.entry == "_vpo_ed_fit"
        answer = {"params": np.linspace(0, 1, 10), "training_mse": 1.0}
        predict = problem.follow_up(fit, answer, problem.seed_program)
        assert predict is not None and predict.entry == "_vpo_ed_predict"
        params, *inputs = predict.args
        assert np.array_equal(params, answer["params"])
        assert [a is data[s].inputs for a, s in zip(inputs, SPLITS, strict=True)] == [True] * 3
        for split in SPLITS:
            target = data[split].target
            arrays = (*fit.args[:1], *predict.args) if split != "train" else predict.args
            for array in arrays:
                assert not np.shares_memory(target, array)
                assert not np.isin(target[:5], array).any()


SPLITS = ("train", "test_id", "test_ood")


# --- names, statement, objectives ---------------------------------------------------------------


def test_bare_name_is_oscillator1_and_every_problem_loads() -> None:
    assert load("equation_discovery").name == "equation_discovery:oscillator1"
    for key, spec in SPECS.items():
        problem = load(f"equation_discovery:{key}")
        assert problem.name == f"equation_discovery:{key}"
        names = ", ".join(f"{n}: np.ndarray" for n, _ in spec.inputs)
        assert f"def equation({names}, params: np.ndarray)" in problem.description
        assert "10 numeric constants" in problem.description
        assert f"def equation({', '.join(n for n, _ in spec.inputs)}, params):" in (
            problem.seed_program
        )
        assert [o.name for o in problem.objectives] == ["fit_id", "fit_ood", "simplicity"]
    with pytest.raises(ProblemLoadError, match="unknown equation_discovery problem 'x'.*bactgrow"):
        load("equation_discovery:x")


def test_best_known_is_llm_srs_better_backbone_per_cell() -> None:
    best = {
        "oscillator1": (7.89e-8, 0.0002),
        "oscillator2": (2.12e-7, 3.81e-5),
        "bactgrow": (0.0026, 0.0037),
        "stressstrain": (0.0162, 0.0516),
    }
    for key, (best_id, best_ood) in best.items():
        fit_id, fit_ood, _ = EquationDiscovery(key).objectives
        assert (fit_id.best_known, fit_ood.best_known) == (best_id, best_ood)
        assert "LLM-SR" in fit_id.source and "2404.18400" in fit_ood.source


def test_log_scale_puts_the_mean_at_0_the_seed_near_it_and_llm_sr_at_1() -> None:
    for key in SPECS:
        fit_id, fit_ood, _ = EquationDiscovery(key).objectives
        for objective, seed in zip((fit_id, fit_ood), SPECS[key].seed_nmse, strict=True):
            assert isinstance(objective, LogFit)
            assert objective.zero == 1.0  # predicting the mean scores NMSE 1
            assert objective.normalise(1.0) == objective.normalise(2.0) == 0.0
            assert 0 <= objective.normalise(seed) < 0.22  # near 0
            if seed < 1:  # worse than the seed, better than the mean: still a signal
                assert 0 < objective.normalise((1 + seed) / 2) < objective.normalise(seed)
            assert objective.normalise(objective.best_known) == pytest.approx(1.0)
            assert objective.normalise(objective.best_known / 10) > 1.0  # a record
            exact = math.log(objective.zero / NMSE_FLOOR) / math.log(
                objective.zero / objective.best_known
            )
            assert objective.normalise(0.0) == pytest.approx(exact)
            assert objective.normalise(float("nan")) == objective.normalise(math.inf) == 0.0
    # halfway in log terms: sqrt(zero * best) scores 0.5
    fit_id = EquationDiscovery("oscillator1").objectives[0]
    assert fit_id.normalise(math.sqrt(fit_id.zero * fit_id.best_known)) == pytest.approx(0.5)


@given(st.floats(0, 1e6), st.floats(0, 1e6))
def test_log_scale_is_finite_and_never_rewards_a_worse_fit(a: float, b: float) -> None:
    objective = EquationDiscovery("oscillator2").objectives[1]
    low, high = sorted((a, b))
    assert 0.0 <= objective.normalise(high) <= objective.normalise(low) <= MAX_SCORE


# --- the trusted scorer, on returned data -------------------------------------------------------


def predicted(
    problem: EquationDiscovery, code: str | None = None, mse: float | None = None, **splits: object
) -> tuple[Call, dict]:
    """The predict call after a fit that reported `mse` (by default what the training
    predictions give), and the predictions: each split's own targets unless given."""
    data = dataset(problem.spec.key)
    value = {s: splits.get(s, data[s].target.copy()) for s in SPLITS}
    if mse is None:
        mse = float(np.mean((np.asarray(value["train"]) - data["train"].target) ** 2))
    fit = {"params": np.ones(10), "training_mse": mse}
    call = problem.follow_up(problem.calls()[0], fit, code or problem.seed_program)
    assert call is not None
    return call, value


def test_scorer_computes_nmse_from_its_own_targets() -> None:
    problem = EquationDiscovery("oscillator1")
    rings = {case.name: 0.0 for case in problem.cases}  # tests/test_case_vectors.py
    assert problem.score(*predicted(problem)) == {
        "fit_id": 0.0,
        "fit_ood": 0.0,
        "simplicity": 10 / 17,  # the seed: 4 operators and 3 params
        **rings,
    }
    data = dataset("oscillator1")
    mean_id = np.full(10000, data["test_id"].target.mean())
    raw = problem.score(*predicted(problem, test_id=mean_id))
    assert raw["fit_id"] == pytest.approx(1.0)  # predicting the mean: NMSE 1
    assert raw["simplicity"] == 0.0  # no fit, no simplicity


def test_simplicity_needs_a_fit_that_halves_the_error_of_the_mean_and_the_seed() -> None:
    # stressstrain's seed is worse than predicting the mean (NMSE 2.60), so a constant
    # (NMSE ~1) beats it; it still gets no simplicity.
    problem = EquationDiscovery("stressstrain")
    train_mean = dataset("stressstrain")["train"].target.mean()
    constant = HEADER.replace("x, v", "strain, temp") + "    return params[0] + 0 * strain\n"
    raw = problem.score(*predicted(problem, constant, test_id=np.full(1442, train_mean)))
    assert 0.9 < raw["fit_id"] < 1.2 and raw["simplicity"] == 0.0
    assert problem.objective("fit_id").normalise(raw["fit_id"]) < 0.05


def test_simplicity_is_earned_by_the_fit_and_lost_by_padding() -> None:
    """0 for an equation no better than the mean, rising on a log scale to all of it at the
    gate; a padded copy of an equation (the same predictions, a larger size) earns less."""
    assert earned(1.0, 0.05) == 0.0 and earned(3.0, 0.05) == 0.0 and earned(math.nan, 0.05) == 0
    assert earned(0.05, 0.05) == 1.0 and earned(1e-9, 0.05) == 1.0
    assert earned(math.sqrt(0.05), 0.05) == pytest.approx(0.5)
    shares = [earned(x, 0.05) for x in np.geomspace(0.99, 0.05, 20)]
    assert shares == sorted(shares) and shares[0] > 0
    problem = EquationDiscovery("oscillator1")
    padded = HEADER + "    return params[0] * x + params[1] * v + params[2] + params[3] * 0 * x\n"
    plain, more = (problem.score(*predicted(problem, code)) for code in (None, padded))
    assert plain["fit_id"] == more["fit_id"] and 0 < more["simplicity"] < plain["simplicity"]


def test_a_fit_the_fresh_process_does_not_reproduce_is_refused() -> None:
    """The fit reports its training error; the predictions made from its constants in another
    process must give the same (to rounding), or the fit is not the equation scored."""
    problem = EquationDiscovery("oscillator1")
    train = dataset("oscillator1")["train"].target
    close = problem.score(*predicted(problem, mse=1e-15, train=train + 1e-8))
    assert close["fit_id"] == 0.0  # NMSE 2e-14 against 2e-13: below 1e-12, accepted
    with pytest.raises(Infeasible, match="reported a training NMSE of 0, but .* gives 0.0"):
        problem.score(*predicted(problem, mse=0.0, train=train + 0.01))


@pytest.mark.parametrize(
    "answer,words",
    [
        ({"params": np.ones(10)}, "not {params, training_mse}"),
        ({"params": np.ones(10), "training_mse": 0.0, "x": 1}, "not {params, training_mse}"),
        ({"params": np.ones(9), "training_mse": 0.0}, "params as 10 finite floats"),
        ({"params": np.ones(10000), "training_mse": 0.0}, "params as 10 finite floats"),
        ({"params": np.ones((2, 5)), "training_mse": 0.0}, "params as 10 finite floats"),
        ({"params": [1.0] * 10, "training_mse": 0.0}, "params as 10 finite floats"),
        ({"params": np.ones(10, dtype=np.int64), "training_mse": 0.0}, "10 finite floats"),
        ({"params": np.full(10, np.nan), "training_mse": 0.0}, "params as 10 finite floats"),
        ({"params": np.full(10, np.inf), "training_mse": 0.0}, "params as 10 finite floats"),
        ({"params": np.ones(10), "training_mse": -1.0}, "training_mse must be a finite"),
        ({"params": np.ones(10), "training_mse": math.nan}, "training_mse must be a finite"),
        ({"params": np.ones(10), "training_mse": "0"}, "training_mse must be a finite"),
    ],
)
def test_a_fit_that_is_not_ten_constants_is_refused(answer: dict, words: str) -> None:
    problem = EquationDiscovery("oscillator1")
    with pytest.raises(Infeasible) as info:
        problem.follow_up(problem.calls()[0], answer, problem.seed_program)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "change,words",
    [
        ({"test_id": [0.0] * 10000}, "expected an array of 10000 float predictions"),
        ({"test_id": np.zeros(10000, dtype=np.int64)}, "float predictions"),
        ({"test_ood": np.zeros(9999)}, "expected 10000 predictions, got shape (9999,)"),
        ({"train": np.zeros(9999)}, "train: expected 10000 predictions, got shape (9999,)"),
        ({"test_id": np.full(10000, np.nan)}, "10000 of 10000 predictions are not finite"),
        ({"test_ood": np.full(10000, 1e300)}, "squared error overflows"),
        ({"extra": 1}, "not {train, test_id, test_ood}"),
    ],
)
def test_scorer_refuses_data_that_is_not_a_prediction(change: dict, words: str) -> None:
    problem = EquationDiscovery("oscillator1")
    call, value = predicted(problem, mse=0.0)
    with pytest.raises(Infeasible) as info:
        problem.score(call, {**value, **change})
    assert words in str(info.value)


def test_the_fits_own_answer_is_never_scored() -> None:
    problem = EquationDiscovery("oscillator1")
    call, value = predicted(problem)
    with pytest.raises(Infeasible, match="only the predictions of a fresh process are scored"):
        problem.score(problem.calls()[0], value)


# --- through the real sandbox -------------------------------------------------------------------


@pytest.mark.parametrize("key", list(SPECS))
def test_seeds_score_near_zero_at_llm_srs_reference_floor(sandbox: Sandbox, key: str) -> None:
    problem = EquationDiscovery(key)
    evaluation = evaluate(problem, problem.seed_program, sandbox)
    assert evaluation.status == "ok", evaluation.reason
    assert evaluation.scores["fit_id"] < 0.22 and evaluation.scores["fit_ood"] < 0.22
    # The seed earns the share of its simplicity its own fit earns: below all of it (which
    # takes half the seed's error), 0 where the seed is no better than the mean.
    equation = problem.read(problem.seed_program)
    assert equation is not None
    share = earned(SPECS[key].seed_nmse[0], problem.simplicity_gate)
    assert evaluation.scores["simplicity"] == pytest.approx(simplicity(equation.size) * share)
    assert share < 1 and (share == 0) == (SPECS[key].seed_nmse[0] >= 1)
    measured = (evaluation.raw["fit_id"], evaluation.raw["fit_ood"])
    assert measured == pytest.approx(SPECS[key].seed_nmse, rel=1e-6)
    assert measured == pytest.approx(FLOOR[key], rel=5e-3)


def test_a_better_equation_scores_well_above_the_seed(sandbox: Sandbox) -> None:
    evaluation = evaluate(EquationDiscovery("oscillator1"), BETTER, sandbox)
    assert evaluation.status == "ok", evaluation.reason
    assert evaluation.raw["fit_id"] < 1e-5 and evaluation.raw["fit_ood"] < 0.05
    assert evaluation.scores["fit_id"] > 0.7 and evaluation.scores["fit_ood"] > 0.35
    # 10 operators (5 products, 2 powers, 3 sums), 2 literals (the exponents), 4 params
    assert evaluation.scores["simplicity"] == 10 / (10 + 16)
    assert "fitted params: [" in evaluation.artifacts["fit"]["stdout"]
    assert evaluation.artifacts["predict"]["stdout"] == ""


def test_numpy_is_there_as_np_as_the_statement_says(sandbox: Sandbox) -> None:
    """A program that uses np without importing it fits like one that imports it."""
    problem = EquationDiscovery("oscillator1")
    body = "def equation(x, v, params):\n    return params[0] * np.sin(x) + params[1] * v\n"
    bare, imported = evaluate_many(problem, [body, "import numpy as np\n\n" + body], sandbox)
    assert bare.status == "ok", bare.reason
    assert bare.raw == imported.raw and bare.scores["fit_id"] > 0


def test_vpo_eval_json(tmp_path: Path) -> None:
    program = tmp_path / "better.py"
    program.write_text(BETTER)
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "eval", "equation_discovery:oscillator1"]
        + [str(program), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "ok" and result["reason"] is None
    assert result["scores"]["fit_id"] > 0.7 and result["scores"]["simplicity"] == 10 / 26
    assert result["raw"]["fit_id"] < 1e-5


NPZ = str(DATA / "oscillator1.npz")
HOSTILE = {
    "nan": (HEADER + "    return params[0] * x + np.nan\n", "training error is not finite"),
    "inf": (HEADER + "    return np.full_like(x, np.inf)\n", "training error is not finite"),
    "inf out of domain": (
        HEADER + "    return params[0] * x + np.where(x > 0.6, np.inf, 0.0)\n",
        "test_ood: 4292 of 10000 predictions are not finite",
    ),
    "overflow out of domain": (
        HEADER + "    return params[0] * x + np.where(x > 0.6, 1e200, 0.0)\n",
        "test_ood: the predictions are so large that their squared error overflows",
    ),
    "wrong shape": (HEADER + "    return np.stack([x, v])\n", "shape (2, 10000) for 10000 rows"),
    "wrong length": (HEADER + "    return (params[0] * x)[:-1]\n", "shape (9999,) for 10000"),
    "a scalar": (HEADER + "    return params[0]\n", "shape () for 10000 rows"),
    "strings": (HEADER + "    return np.array(['1.0'] * len(x))\n", "<U3 values, not real"),
    "a str": (HEADER + "    return 'fast'\n", "<U4 values, not real numbers"),
    "None": (HEADER + "    pass\n", "object values, not real numbers"),
    "complex": (HEADER + "    return params[0] * x + 1j\n", "complex128 values, not real"),
    "an exception": (HEADER + "    raise RuntimeError('boom')\n", "RuntimeError: boom"),
    "no equation": ("equation = 3\n", "the program defines no function `equation`"),
    "opening the data": (
        HEADER + f"    open({NPZ!r}, 'rb').read()\n    return params[0] * x\n",
        "FileNotFoundError",
    ),
    "np.load of the data": (
        HEADER + f"    np.load({NPZ!r})\n    return params[0] * x\n",
        "FileNotFoundError",
    ),
    "importing the problem": (
        HEADER + "    import problems.equation_discovery\n    return params[0] * x\n",
        "No module named 'problems'",
    ),
    "params of another length from a patched np.ones": (
        "import numpy as np\n\n_ones = np.ones\n"
        "np.ones = lambda n, *args, **options: _ones(11)\n\n\n" + SEED_FIT,
        "params as 10 finite floats",
    ),
    "random predictions": (
        HEADER + "    return params[0] * x + np.random.default_rng().normal(size=len(x))\n",
        "it must compute the same values in both",
    ),
}


@pytest.fixture(scope="module")
def hostile(sandbox: Sandbox) -> dict[str, Evaluation]:
    """All hostile programs on oscillator1 in one parallel batch, run as written (the grammar
    refuses most of them: `test_the_grammar_refuses_or_zeroes_every_hostile_program`)."""
    problem = AsWritten("oscillator1")
    codes = [code for code, _ in HOSTILE.values()]
    return dict(zip(HOSTILE, evaluate_many(problem, codes, sandbox), strict=True))


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_programs_score_zero_with_a_reason(
    hostile: dict[str, Evaluation], case: str
) -> None:
    assert_zero_with_reason(hostile[case], HOSTILE[case][1])


def test_sleeping_past_the_time_limit_is_a_timeout(sandbox: Sandbox) -> None:
    code = "import time\n" + HEADER + "    time.sleep(60)\n    return params[0] * x\n"
    evaluation = evaluate(AsWritten("oscillator1"), code, sandbox, Limits(3.0))
    assert evaluation.status == "timeout"
    assert_zero_with_reason(evaluation, "timed out after 3.0 s")


def test_printing_claims_and_mutating_arguments_change_nothing(sandbox: Sandbox) -> None:
    """What the program prints is never read as a score; `equation` gets copies of its
    arguments, so writing into them cannot disturb the fit."""
    claims = HEADER + "    print('NMSE 0.0, fit_id 1.0')\n" + SEED_BODY
    mutating = HEADER + (
        "    result = params[0] * x + params[1] * v + params[2]\n"
        "    x *= 0\n"
        "    v[:] = np.nan\n"
        "    params[:] = 0\n"
        "    return result\n"
    )
    problem = AsWritten("oscillator1")
    seed, printed, mutated = evaluate_many(
        problem, [problem.seed_program, claims, mutating], sandbox
    )
    # The fits are the seed's (simplicity is 0 for both: no grammar reads their statements).
    fits = ("fit_id", "fit_ood")
    assert printed.status == "ok" and [printed.scores[k] for k in fits] == [
        seed.scores[k] for k in fits
    ]
    assert "NMSE 0.0" in printed.artifacts["fit"]["stdout"]
    assert mutated.status == "ok" and [mutated.raw[k] for k in fits] == [seed.raw[k] for k in fits]
    assert printed.scores["simplicity"] == mutated.scores["simplicity"] == 0


def test_the_grammar_refuses_or_zeroes_every_hostile_program(sandbox: Sandbox) -> None:
    """The real problem: each hostile program is refused before any process starts (a one-line
    reason, nothing run) or, where it is an equation after all, scores 0 with its reason."""
    problem = EquationDiscovery("oscillator1")
    codes = [code for code, _ in HOSTILE.values()]
    found = dict(zip(HOSTILE, evaluate_many(problem, codes, sandbox), strict=True))
    for case, evaluation in found.items():
        assert set(evaluation.scores.values()) == {0.0}, case
        assert evaluation.reason and "\n" not in evaluation.reason, case
        if evaluation.reason.startswith("refused before running: "):
            assert evaluation.artifacts == {}, case  # no process ran
    ran = {case for case, e in found.items() if not e.reason.startswith("refused")}  # type: ignore[union-attr]
    assert ran == {"a scalar"}  # `return params[0]`: an equation, of the wrong shape


def test_an_import_inside_the_equation_is_refused() -> None:
    code = HEADER + (
        "    from scipy.special import erf\n"
        "    return params[0] * erf(params[1] * x) + params[2] * v + params[3] * x**3\n"
    )
    with pytest.raises(ValueError, match="an import in `equation`"):
        EquationDiscovery("oscillator1").admit(code)


# Module-level code runs before the driver's guard: it looks for the test targets on disk (by
# importing the package, asking importlib, walking up from each import folder, and at the path
# the test knows, as an attacker who guessed it) and answers the test inputs with them.
def steal_targets(guessed: Path) -> str:
    """The program, `guessed` the package folder it knows."""
    return f"""
import importlib.util, os, sys
import numpy as np

def _stolen():
    folders = []
    try:
        import problems.equation_discovery as package
        folders.append(os.path.dirname(package.__file__))
    except Exception:
        pass
    try:
        spec = importlib.util.find_spec("problems.equation_discovery")
        folders.append(os.path.dirname(spec.origin))
    except Exception:
        pass
    for entry in sys.path:
        while entry not in ("", "/"):
            folders.append(os.path.join(entry, "problems", "equation_discovery"))
            entry = os.path.dirname(entry)
    folders.append({str(guessed)!r})
    for folder in folders:
        try:
            with np.load(os.path.join(folder, "data", "oscillator1.npz")) as stored:
                return [stored["test_id"], stored["test_ood"]]
        except (OSError, KeyError):
            pass
    return []

TABLES = _stolen()
print("stolen" if TABLES else "nothing found")


def equation(x, v, params):
    for table in TABLES:
        if np.array_equal(x, table[:, 0]) and np.array_equal(v, table[:, 1]):
            return table[:, 2].copy()
    return params[0] * x + params[1] * v + params[2]
"""


def test_the_sandbox_hides_the_test_targets(sandbox: Sandbox) -> None:
    """The same program scores above LLM-SR where the data are in sight and exactly the seed's
    scores where the sandbox hides them (its default). In sight means a copy outside /tmp when the
    checkout lies there: every candidate has a private /tmp, hidden data or not."""

    class Exposed(AsWritten):
        def private_paths(self) -> tuple[str, ...]:
            return ()

    with (
        in_a_candidates_sight(DATA / "oscillator1.npz") as data,
        Sandbox(workers=1, private_paths=()) as exposed,
    ):
        stolen = evaluate(Exposed("oscillator1"), steal_targets(data.parents[1]), exposed)
    assert stolen.status == "ok" and "stolen" in stolen.artifacts["fit"]["stdout"]
    assert stolen.scores["fit_id"] > 2.5 and stolen.scores["fit_ood"] > 1  # far above LLM-SR
    evaluation = evaluate(AsWritten("oscillator1"), steal_targets(DATA.parent), sandbox)
    assert evaluation.status == "ok", evaluation.reason
    assert "nothing found" in evaluation.artifacts["fit"]["stdout"]
    seed = evaluate(EquationDiscovery("oscillator1"), EquationDiscovery().seed_program, sandbox)
    # The seed's fits (its simplicity is 0: the grammar does not read the stealing program).
    fits = ("fit_id", "fit_ood")
    assert [evaluation.scores[k] for k in fits] == [seed.scores[k] for k in fits]
    assert evaluation.scores["fit_id"] < 0.22


def test_each_problem_declares_its_data_private() -> None:
    for key in SPECS:
        assert tuple(EquationDiscovery(key).private_paths()) == (str(DATA),)


def test_a_campaign_stores_the_nmse_and_prompts_with_it(tmp_path: Path) -> None:
    """Completions as data through the campaign's own path: parsed, evaluated, stored with
    the NMSE as raw value, and the next prompt states the task and shows the scores."""
    from harness.config.settings import build
    from harness.evolution.iteration import SampledIteration
    from harness.evolution.loop import prepare
    from harness.evolution.prompts import build_prompt
    from harness.evolution.recording import evaluate_and_store
    from harness.evolution.selection import Selection
    from harness.llm import Completion
    from harness.store import Store

    problem = EquationDiscovery("oscillator1")
    config = build({"problem": problem.name, "candidates": 2, "group_size": 1})
    store = Store.open(tmp_path / "campaign.db")
    campaign_id = store.create_campaign("manual", problem.name, config.to_dict(), 0)
    text = "".join(
        f"<candidate_{i}>\n```python\n{code}```\n</candidate_{i}>\n"
        for i, code in enumerate((BETTER, NOT_FINITE), start=1)
    )
    with Sandbox(workers=2) as box:
        campaign = prepare(config, store, problem, campaign_id, box)
        seed = store.program(campaign.seed_id)
        prompt = [{"role": "user", "content": "improve"}]
        completion = Completion(text, (1, 2), None, "stop", (7, 8))
        sampled = SampledIteration(0, Selection(0, seed.id, ()), seed, prompt, [completion], [])
        list(evaluate_and_store(campaign, [sampled]))
    by_status = {p.status: p for p in store.programs(campaign_id, origin="llm")}
    better, failed = by_status["ok"], by_status["error"]
    assert better.scores["fit_id"] > 0.7 and better.raw["fit_id"] < 1e-5
    assert set(failed.scores.values()) == {0.0} and "not finite" in failed.error
    user = build_prompt(problem, better, [seed], candidates=2)[1]["content"]
    assert "def equation(x: np.ndarray, v: np.ndarray, params: np.ndarray)" in user
    assert "fit_id 0.8" in user and "best known 7.89e-08" in user


def test_an_equations_family_ignores_how_its_constants_are_written() -> None:
    from problems.equation_discovery.family import family_key

    inputs = ("x", "v")
    seed = family_key("params[0] * x + params[1] * v + params[2]", inputs)
    assert seed == "c*1 + c*v + c*x"
    for same in (
        "params[0] * x + params[1] * v + params[2] + params[8] + params[9] - params[9]",
        "params[3] * (x + params[4]) + v * params[1]",
        "params[0] * x + params[5] * x + params[1] * v + params[2] / params[7]",
        "(params[0] * x + params[1] * v) - -params[2]",
    ):
        assert family_key(same, inputs) == seed, same
    for other in (
        "params[0] * x + params[1] * v",  # no constant term
        "params[0] * x + params[1] * v + params[2] + params[3] * x * v",
        "params[0] * x + params[1] * v ** 2 + params[2]",
        "2 * x + params[1] * v + params[2]",  # a fixed coefficient is not a free one
        "params[0] * np.sin(x) + params[1] * v + params[2]",
    ):
        assert family_key(other, inputs) not in (seed, None), other
    assert family_key("params[1] * np.sin(params[2] * x)", inputs) == family_key(
        "params[7] * np.sin(params[0] * x)", inputs
    )
    # What the grammar refuses has no key (compared by code alone); nothing is evaluated.
    for unread in ("x if v else 1", "__import__('os').system('true')", "params[i] * x", "x +"):
        assert family_key(unread, inputs) is None, unread
    # Like terms are collected as the product grows: (x + v) ** 12 written out is 13 terms.
    assert family_key(" * ".join(["(x + v)"] * 12), inputs).count("+") == 12  # type: ignore[union-attr]
    wide = "(" + " + ".join(f"x ** {k}" for k in range(1, 18)) + ")"
    # 17 x 17 products are too many: the key is the expression's structure, bounded.
    assert family_key(f"{wide} * {wide}", inputs).startswith("tree:")  # type: ignore[union-attr]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="xv+-*/() .0123456789paramsnpi[]", max_size=60))
def test_the_family_key_reads_any_text_without_failing(text: str) -> None:
    from problems.equation_discovery.family import family_key

    key = family_key(text, ("x", "v"))
    assert key is None or isinstance(key, str)
