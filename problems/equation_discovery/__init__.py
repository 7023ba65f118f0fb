"""Equation discovery on LLM-SR's four problems (Shojaee et al., ICLR 2025, arXiv 2404.18400).

The candidate writes an equation skeleton, `equation(<inputs>, params)`, whose ten constants
`params` are fitted to the training data (driver.py): first as LLM-SR fits them (scipy BFGS from
ten ones on the training MSE, at most MAXITER iterations), then by least squares on the
residuals from that result and from ten ones, the best finite fit kept; every step stops on a
budget of evaluations, never on the clock, so a program always gets the same constants
(benchmarks/equation_fit.py). The scores cannot be faked by construction, not by a list of refused
tricks: no process that holds a target value produces the predictions that are scored.
1. The fit runs in one sandboxed process, which receives the training inputs and targets (never
   a test input or target) and returns only the ten constants and the training MSE it reached;
   the constants must be ten finite numbers.
2. A fresh sandboxed process receives those constants and the inputs of the training set and
   both test sets, never a target, and returns the equation's predictions on them. Nothing else
   crosses between the two processes: each has its own /tmp, /dev/shm and IPC namespace, its
   environment is the sandbox's, and the first has ended before the second starts.
3. Here, in the trusted process, the training error is recomputed from the fresh predictions
   and must be the one the fit reported (a program that computes something else once fitted is
   refused), and the NMSE, sum((yhat - y)^2) / sum((y - mean y)^2), is computed on each test
   set. A program cannot read a target from disk either: the sandbox hides data/ (the problem's
   `private_paths`) and the project's packages from both processes.
What a fit can pass on is its ten constants: at most 640 bits, the capacity of the skeleton's
constants themselves, which is what the statement allows.

Problems (`equation_discovery:NAME`; bare `equation_discovery` is oscillator1):
- oscillator1: acceleration a(x, v) of a damped nonlinear oscillator with a driving force;
- oscillator2: the same kind of system with time, a(t, x, v);
- bactgrow: E. coli growth rate db(b, s, temp, pH);
- stressstrain: stress(strain, temp) of aluminium 6061-T651, measured data.

Reward vector:
- fit_id, fit_ood: NMSE on test_id / test_ood on a log scale, log(zero / NMSE) /
  log(zero / best), where best is LLM-SR's better backbone per cell (scores 1) and zero is 1,
  what predicting the mean scores (scores 0; clamped there). The seeds score 0 to 0.21, near 0,
  and an equation worse than its seed but better than a constant still scores something, which
  gives a policy a signal to learn from before the seed is beaten. NMSE spans eight orders of
  magnitude across methods, so a ratio would give nothing to everything but the best. Beating
  LLM-SR scores above 1.
- simplicity: HALF / (HALF + size) (grammar.size), size = operators + literals + params of
  the expression, each once per use, read from the grammar's tree here, never from running it;
  a literal costs what a fitted constant costs. Times the share the fit earns (`earned`): 0
  at an in-domain NMSE of 1 or worse, so `params[0] + 0 * x` cannot win it, all of it at half
  the seed's NMSE (or 0.5 where the seed does worse than the mean), on a log scale between.

Data: LLM-SR's CSVs (github.com/deep-symbolic-mathematics/LLM-SR, data/, MIT licence in
data/LICENSE), stored as float64 arrays in data/<problem>.npz by scripts/llm_sr_data.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from problems.api import MAX_SCORE, Anchor, Call, Infeasible, Objective, Problem
from problems.equation_discovery import grammar
from problems.equation_discovery.expression import Expression
from problems.equation_discovery.family import key_of
from problems.equation_discovery.statement import COMPACT_DESCRIPTION, DESCRIPTION

DATA = Path(__file__).parent / "data"
DRIVER = (Path(__file__).parent / "driver.py").read_text()
DEFAULT = "oscillator1"
NPARAMS = 10
# The fit's first step, LLM-SR's BFGS, at most this many iterations (scipy's default is 200 per
# constant, 2,000). The skeletons tried here converged in 6-21 iterations (the seeds) to 142 (a
# rational function of all three inputs on oscillator2's 10,000 rows); an iteration is about 12
# evaluations of the equation. The least-squares steps after it add at most 3,200 evaluations
# (driver.py), so a fit is at most ~5,800 evaluations, each 0.5-4 ms on 10,000 rows.
MAXITER = 200
# Seconds for each call (scipy's import and the fit; then the predictions): a safety net only,
# since the fit stops on its budget of evaluations. The slowest of 20 honest skeletons took
# 5.3 s to fit in the sandbox on 2 cores (benchmarks/results/equation_fit.md); 60 s leaves room
# for a loaded machine and heavier equations, where a fit cut by the clock would not score the
# same twice.
TIME_LIMIT = 60.0
# An NMSE below this counts as this, so an exact equation scores a finite amount (about 3).
NMSE_FLOOR = 1e-20
# How far the training NMSE recomputed from the fresh process's predictions may lie from the
# fit's own (relative, plus an absolute part for fits near exact): rounding, not another equation.
REPRODUCED = (1e-6, 1e-12)

SOURCE_LLMSR = (
    "LLM-SR, Shojaee et al., ICLR 2025, arXiv 2404.18400 ({backbone}), NMSE as reprinted in"
    " DecAEvolve's results table (Behzadifar et al., ICML 2026)"
)
SOURCE_PYSR = "PySR, as reported beside LLM-SR (DecAEvolve's results table)"
SOURCE_SEED = (
    "the seed skeleton fitted here (driver.py: LLM-SR's BFGS from ones, then least squares)"
)


@dataclass(frozen=True)
class LogFit(Objective):
    """An NMSE (minimised) scored on a log scale: `zero` scores 0, `best_known` scores 1.

    score = log(zero / NMSE) / log(zero / best_known), never below 0, and above 1 for an NMSE
    below the best known (NMSE_FLOOR bounds it).
    """

    zero: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.zero > self.best_known:
            raise ValueError(f"objective {self.name!r}: zero must be above best_known")

    def normalise(self, raw: float) -> float:
        if not math.isfinite(raw) or raw < 0:
            return 0.0
        nmse = max(raw, NMSE_FLOOR)
        score = math.log(self.zero / nmse) / math.log(self.zero / self.best_known)
        return min(MAX_SCORE, max(0.0, score))


@dataclass(frozen=True)
class Spec:
    """One of LLM-SR's problems: its variables, seed skeleton and reference NMSE values."""

    key: str
    subject: str  # what the equation gives, in words
    inputs: tuple[tuple[str, str], ...]  # (argument name, meaning), in the CSV's column order
    target: str  # the returned quantity's meaning
    ood: str  # what makes the out-of-domain test set different
    seed: str  # the body of the seed skeleton (LLM-SR's initial equation)
    seed_nmse: tuple[float, float]  # (test_id, test_ood), measured here (see below)
    mixtral: tuple[float, float]  # LLM-SR's NMSE with each backbone, and PySR's
    gpt35: tuple[float, float]
    pysr: tuple[float, float]


# The seed NMSE values are the raw fit_id / fit_ood of each seed through the real sandbox:
#   for k in oscillator1 oscillator2 bactgrow stressstrain; do .venv/bin/python -c "from
#   problems.equation_discovery import EquationDiscovery as E; print(E('$k').seed_program)"
#   > /tmp/seed.py; .venv/bin/vpo eval equation_discovery:$k /tmp/seed.py --json; done
# LLM-SR's spec fitted with its BFGS alone gives oscillator1 0.0959 / 0.863, oscillator2 0.195 /
# 0.117, bactgrow 0.865 / 1.20, stressstrain 2.60 / 4.76 (docs/problems.md).
SPECS = {
    spec.key: spec
    for spec in (
        Spec(
            "oscillator1",
            "the acceleration of a damped nonlinear oscillator driven by an external force",
            (("x", "position"), ("v", "velocity")),
            "acceleration",
            "a part of the motion with wider ranges of position and velocity than training",
            "params[0] * x + params[1] * v + params[2]",
            (0.0959159259, 0.862584877),
            (7.89e-8, 0.0002),
            (4.65e-7, 0.0005),
            (9.0e-4, 0.3106),
        ),
        Spec(
            "oscillator2",
            "the acceleration of a damped nonlinear oscillator driven by an external force",
            (("t", "time"), ("x", "position"), ("v", "velocity")),
            "acceleration",
            "an earlier stretch of time, t in [0, 20), where training covers t in [30, 50]",
            "params[0] * t + params[1] * x + params[2] * v + params[3]",
            (0.194511797, 0.117069596),
            (0.0030, 0.0291),
            (2.12e-7, 3.81e-5),
            (2.0e-4, 0.0098),
        ),
        Spec(
            "bactgrow",
            "the growth rate of an E. coli population",
            (
                ("b", "population density"),
                ("s", "substrate concentration"),
                ("temp", "temperature"),
                ("pH", "pH level"),
            ),
            "growth rate (change of population density)",
            "wider ranges of every input: b and s up to 10 (training: 1 to 5), temperature up"
            " to 60 (training: up to 40), pH 1 to 14 (training: 2 to 12)",
            "params[0] * b + params[1] * s + params[2] * temp + params[3] * pH + params[4]",
            (0.864759804, 1.20289570),
            (0.0026, 0.0037),
            (0.0214, 0.0264),
            (0.0376, 1.0141),
        ),
        Spec(
            "stressstrain",
            "the stress in an aluminium rod (alloy 6061-T651, measured data) through its elastic"
            " and plastic regions",
            (("strain", "strain"), ("temp", "normalised temperature")),
            "stress",
            "a temperature left out of training (training and in-domain test use five others)",
            "params[0] * strain + params[1] * temp",
            (2.60163576, 4.76023359),
            (0.0162, 0.0946),
            (0.0210, 0.0516),
            (0.0331, 0.1304),
        ),
    )
}


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _program(spec: Spec, body: str, doc: str) -> str:
    names = ", ".join(name for name, _ in spec.inputs)
    return f'''\
import numpy as np


def equation({names}, params):
    """{doc}"""
    return {body}
'''


def _fit_objective(spec: Spec, split: int) -> LogFit:
    """fit_id (split 0) or fit_ood (split 1), anchored to LLM-SR's better backbone."""
    name, where = ("fit_id", "in-domain") if split == 0 else ("fit_ood", "out-of-domain")
    mixtral, gpt = spec.mixtral[split], spec.gpt35[split]
    best, backbone = (mixtral, "Mixtral") if mixtral <= gpt else (gpt, "GPT-3.5")
    # NMSE 1 is what predicting the mean scores: 0 there, so an equation worse than the seed
    # but better than a constant still scores (a learning signal before the seed is beaten).
    zero = 1.0
    return LogFit(
        name,
        "min",
        best,
        SOURCE_LLMSR.format(backbone=backbone),
        f"{where} NMSE on test_{'id' if split == 0 else 'ood'}, log scale: 0 at {zero:.3g},"
        f" 1 at {best:.3g}",
        (
            Anchor(spec.seed_nmse[split], SOURCE_SEED),
            Anchor(spec.pysr[split], SOURCE_PYSR),
            Anchor(mixtral, SOURCE_LLMSR.format(backbone="Mixtral")),
            Anchor(gpt, SOURCE_LLMSR.format(backbone="GPT-3.5")),
        ),
        zero=zero,
    )


@dataclass(frozen=True)
class Split:
    inputs: np.ndarray  # (rows, variables)
    target: np.ndarray  # (rows,)


@cache
def dataset(key: str) -> dict[str, Split]:
    """train / test_id / test_ood of one problem, as LLM-SR's CSVs hold them."""
    with np.load(DATA / f"{key}.npz", allow_pickle=False) as stored:
        columns = [str(c) for c in stored["columns"]]
        expected = [name for name, _ in SPECS[key].inputs]
        if columns[:-1] != expected:
            raise ValueError(f"{key}.npz has columns {columns}, expected {expected} + target")
        splits = {}
        for split in ("train", "test_id", "test_ood"):
            table = stored[split]
            splits[split] = Split(np.ascontiguousarray(table[:, :-1]), table[:, -1].copy())
            for array in (splits[split].inputs, splits[split].target):
                array.flags.writeable = False  # cached and shared by every evaluation
    return splits


def nmse(predictions: Any, target: np.ndarray, split: str) -> float:
    """sum((yhat - y)^2) / sum((y - mean y)^2), after checking the predictions strictly."""
    rows = target.shape[0]
    if not isinstance(predictions, np.ndarray) or predictions.dtype.kind != "f":
        raise Infeasible(f"{split}: expected an array of {rows} float predictions")
    if predictions.shape != (rows,):
        raise Infeasible(f"{split}: expected {rows} predictions, got shape {predictions.shape}")
    bad = int(np.count_nonzero(~np.isfinite(predictions)))
    if bad:
        raise Infeasible(f"{split}: {bad} of {rows} predictions are not finite (NaN or inf)")
    with np.errstate(over="ignore", invalid="ignore"):
        error = float(np.sum((predictions.astype(np.float64) - target) ** 2))
    if not math.isfinite(error):
        raise Infeasible(
            f"{split}: the predictions are so large that their squared error overflows"
        )
    return error / float(np.sum((target - target.mean()) ** 2))


OBJECTIVES = ("fit_id", "fit_ood", "simplicity")
# The cases (Problem.cases): test_id cut into RINGS parts of equal size by the distance of each
# row's inputs from the training inputs' mean, in training standard deviations. Near the centre
# an oscillator is nearly linear and a growth rate near its optimum; far out the nonlinear terms
# dominate: an equation that captures one regime scores on its part. Each part's NMSE is
# against its own variance, on fit_id's log scale.
RINGS = 4


@cache
def rings(key: str) -> tuple[np.ndarray, ...]:
    """The rows of test_id in each ring, nearest the centre first (disjoint, all rows)."""
    data = dataset(key)
    train = data["train"].inputs
    scale = np.where(train.std(axis=0) > 0, train.std(axis=0), 1.0)
    distance = np.linalg.norm((data["test_id"].inputs - train.mean(axis=0)) / scale, axis=1)
    order = np.argsort(distance, kind="stable")
    parts = tuple(np.sort(part) for part in np.array_split(order, RINGS))
    for part in parts:
        part.flags.writeable = False
    return parts


def ring_name(index: int) -> str:
    return f"id_ring{index + 1}"


class EquationDiscovery(Problem):
    entry = "equation"
    driver = DRIVER
    driver_entry = "_vpo_ed_fit"  # then `_vpo_ed_predict`, in a fresh process (`follow_up`)
    time_limit = TIME_LIMIT
    edits = False  # an equation is a few lines: complete programs only (see Problem.edits)

    def __init__(self, key: str = DEFAULT) -> None:
        if key not in SPECS:
            raise ValueError(
                f"unknown equation_discovery problem {key!r}; choose {', '.join(SPECS)}"
            )
        self.spec = spec = SPECS[key]
        self.name = f"equation_discovery:{key}"
        fit_id, fit_ood = _fit_objective(spec, 0), _fit_objective(spec, 1)
        # half the error of the seed and of predicting the mean, in-domain
        self.simplicity_gate = min(spec.seed_nmse[0], 1.0) / 2
        self.objectives = (
            fit_id,
            fit_ood,
            Objective(
                "simplicity",
                "max",
                1.0,
                "by definition: an equation of size 0 (an input returned as it is)",
                f"{grammar.HALF} / ({grammar.HALF} + operators + literals + params used), times"
                f" log(1 / NMSE_id) / log(1 / {self.simplicity_gate:.3g}) clipped to [0, 1]: 0"
                " for an equation no better than predicting the mean, all of it from an"
                f" in-domain NMSE of {self.simplicity_gate:.3g}",
            ),
        )
        self.cases = tuple(
            LogFit(
                ring_name(i),
                "min",
                fit_id.best_known,
                fit_id.source,
                f"in-domain NMSE on ring {i + 1} of {RINGS} of test_id (rows by distance from the"
                " training inputs' mean, in standard deviations; nearest first), against the"
                " ring's own variance, on fit_id's log scale",
                zero=fit_id.zero,
            )
            for i in range(RINGS)
        )
        names = [name for name, _ in spec.inputs]
        example = f"params[0] * {names[0]} ** 2 + params[1] * np.sin({names[-1]})"
        facts = dict(
            subject=spec.subject,
            given=_and([m if m == n else f"{m} ({n})" for n, m in spec.inputs]),
            signature=", ".join(f"{n}: np.ndarray" for n in names) + ", params: np.ndarray",
            arguments="\n".join(f"    {name}: {meaning}" for name, meaning in spec.inputs),
            target=spec.target,
            nparams=NPARAMS,
            half=grammar.HALF,
            last=NPARAMS - 1,
            maxiter=MAXITER,
            limit=TIME_LIMIT,
            rows=len(dataset(key)["train"].target),
            ood=spec.ood,
            gate=self.simplicity_gate,
            seed_id=fit_id.normalise(spec.seed_nmse[0]),
            seed_ood=fit_ood.normalise(spec.seed_nmse[1]),
            best_id=fit_id.best_known,
            best_ood=fit_ood.best_known,
            example=example,
            functions=", ".join(f"np.{name}" for name in grammar.STATED),
        )
        self.description = DESCRIPTION.format(**facts)
        self.compact = Expression(
            tuple(names),
            COMPACT_DESCRIPTION.format(**facts),
            example,
            lambda body: _program(spec, body, f"{spec.target.capitalize()}."),
        )
        self.seed_program = self.compact.program(spec.seed)

    def admit(self, code: str) -> str:
        """The harness's program for a candidate the grammar accepts (grammar.py), written from
        the parsed expression; ValueError (grammar.Refused) with the reason otherwise."""
        return self.compact.program(code)

    def read(self, code: str) -> grammar.Equation | None:
        """The equation a program states, or None where the grammar refuses it."""
        try:
            return grammar.read(code, self.compact.inputs)
        except grammar.Refused:
            return None

    def family(self, code: str) -> str | None:
        """The equation family of the expression `code` states (family.py: bounded, and
        shared only by one family up to its fitted constants); None for a text the grammar
        refuses."""
        equation = self.read(code)
        return None if equation is None else key_of(equation.tree, self.compact.inputs)

    def calls(self) -> tuple[Call, ...]:
        train = dataset(self.spec.key)["train"]
        args = (train.inputs, train.target, MAXITER)
        cases = tuple(case.name for case in self.cases)
        return (Call("fit", args, OBJECTIVES, entry="_vpo_ed_fit", cases=cases),)

    def follow_up(self, call: Call, value: Any, code: str) -> Call | None:
        """After the fit, the predictions: a fresh process gets the ten constants the fit
        returned and every split's inputs, never a target."""
        if call.key != "fit":
            return None
        if not isinstance(value, dict) or set(value) != {"params", "training_mse"}:
            raise Infeasible("the fit's answer is not {params, training_mse}")
        params = value["params"]
        if (
            not isinstance(params, np.ndarray)
            or params.dtype.kind != "f"
            or params.shape != (NPARAMS,)
            or not np.isfinite(params).all()
        ):
            raise Infeasible(f"the fit must return params as {NPARAMS} finite floats")
        mse = value["training_mse"]
        if type(mse) is not float or not math.isfinite(mse) or mse < 0:
            raise Infeasible("the fit's training_mse must be a finite number >= 0")
        data = dataset(self.spec.key)
        inputs = (data["train"].inputs, data["test_id"].inputs, data["test_ood"].inputs)
        equation = self.read(code)
        fitted = Fitted(mse, None if equation is None else equation.size)
        args = (params.astype(np.float64), *inputs)
        cases = tuple(case.name for case in self.cases)
        return Call(
            "predict", args, OBJECTIVES, entry="_vpo_ed_predict", context=fitted, cases=cases
        )

    def score(self, call: Call, value: Any) -> Mapping[str, float]:
        fitted = call.context
        if call.key != "predict" or not isinstance(fitted, Fitted):
            raise Infeasible("only the predictions of a fresh process are scored")
        if not isinstance(value, dict) or set(value) != {"train", "test_id", "test_ood"}:
            raise Infeasible("the predictions are not {train, test_id, test_ood}")
        data = dataset(self.spec.key)
        train = data["train"].target
        nmse_train = nmse(value["train"], train, "train")
        claimed = fitted.training_mse * len(train) / float(np.sum((train - train.mean()) ** 2))
        relative, absolute = REPRODUCED
        if not math.isclose(nmse_train, claimed, rel_tol=relative, abs_tol=absolute):
            raise Infeasible(
                f"the fit reported a training NMSE of {claimed:.6g}, but the equation with those"
                f" params gives {nmse_train:.6g} in a fresh process; it must compute the same"
                " values in both"
            )
        target_id = data["test_id"].target
        nmse_id = nmse(value["test_id"], target_id, "test_id")
        nmse_ood = nmse(value["test_ood"], data["test_ood"].target, "test_ood")
        simple = grammar.simplicity(fitted.size) * earned(nmse_id, self.simplicity_gate)
        # nmse() has checked every prediction: the rings are parts of the same array.
        cases = {
            ring_name(i): nmse(value["test_id"][rows], target_id[rows], f"test_id ring {i + 1}")
            for i, rows in enumerate(rings(self.spec.key))
        }
        return {"fit_id": nmse_id, "fit_ood": nmse_ood, "simplicity": simple, **cases}


def earned(nmse_id: float, gate: float) -> float:
    """The share of its simplicity an equation earns by its in-domain fit: 0 at or above NMSE 1
    (no better than predicting the mean, so a constant or a padded constant earns nothing), 1 at
    or below `gate` (half the seed's NMSE), and log(1 / NMSE) / log(1 / gate) between, so that
    a smaller equation with a fair fit and a larger one with a better fit both reach the front
    (benchmarks/results/simplicity_rules.md: the front of a stored campaign doubles against an
    all-or-nothing gate)."""
    if not nmse_id < 1:
        return 0.0
    if nmse_id <= gate:
        return 1.0
    return math.log(nmse_id) / math.log(gate)


@dataclass(frozen=True)
class Fitted:
    """What the scorer keeps of a fit while a fresh process predicts: the training MSE it
    reported and the program's size (None where its text has none)."""

    training_mse: float
    size: int | None


def make_problem(argument: str | None = None) -> Problem:
    """`equation_discovery` (oscillator1) or `equation_discovery:NAME`."""
    return EquationDiscovery(DEFAULT if argument is None else argument)
