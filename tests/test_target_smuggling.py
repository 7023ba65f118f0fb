"""Equation discovery cannot be faked by carrying the targets to where the predictions are made.

Each program here reads the training targets where they are (the fitting process's frames),
answers every input from them by nearest neighbour once it has them, and tries to carry them
to the predicting process by one channel: files in /tmp, /var/tmp, /dev/shm and its working
folder, POSIX and System V shared memory, the environment, numpy's module, the ten constants.
The control runs the same program with the fit and the predictions in one process, as the
scorer did before: there it scores near LLM-SR in-domain (the attack is real). Split, the predicting
process finds nothing, and the fit is refused (its training error, zero, is not what the
constants give without the targets) or scores as the seed does. A last program searches the
predicting process's memory for target values it was told and finds none, where the fitting
process's search finds the training targets.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from conftest import AsWritten

from harness.evaluation.evaluate import evaluate, evaluate_many
from harness.evaluation.sandbox import Sandbox
from problems.api import Call, Evaluation
from problems.equation_discovery import (
    DRIVER,
    MAXITER,
    OBJECTIVES,
    EquationDiscovery,
    Fitted,
    dataset,
)

CHANNELS: dict[str, tuple[str, str]] = {
    # name: (code that sends `table`, an array of rows x, v, y; code that sets `table` or None)
    "a file in /tmp": (
        "np.save('/tmp/carried.npy', table)",
        "table = np.load('/tmp/carried.npy')",
    ),
    "a file in /var/tmp": (
        "np.save('/var/tmp/carried.npy', table)",
        "table = np.load('/var/tmp/carried.npy')",
    ),
    "a file in /dev/shm": (
        "np.save('/dev/shm/carried.npy', table)",
        "table = np.load('/dev/shm/carried.npy')",
    ),
    "a file in the working folder": (
        "np.save(os.path.join(os.getcwd(), 'carried.npy'), table)",
        "table = np.load(os.path.join(os.getcwd(), 'carried.npy'))",
    ),
    "POSIX shared memory": (
        "import _posixshmem\n"
        "fd = _posixshmem.shm_open('/vpo-carried', os.O_CREAT | os.O_RDWR, 0o666)\n"
        "os.write(fd, table.tobytes())",
        "import _posixshmem\n"
        "fd = _posixshmem.shm_open('/vpo-carried', os.O_RDONLY, 0)\n"
        "table = np.frombuffer(os.read(fd, 10**7), dtype=np.float64).reshape(-1, 3)",
    ),
    "System V shared memory": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.shmat.restype = ctypes.c_void_p\n"
        "shm = libc.shmget(0x56504F, 8 + table.nbytes, 0o1666)\n"
        "address = libc.shmat(shm, None, 0)\n"
        "ctypes.memmove(address, np.int64(table.nbytes).tobytes() + table.tobytes(), "
        "8 + table.nbytes)",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.shmat.restype = ctypes.c_void_p\n"
        "shm = libc.shmget(0x56504F, 0, 0)\n"
        "table = None\n"
        "if shm >= 0:\n"
        "    address = libc.shmat(shm, None, 0)\n"
        "    size = int(np.frombuffer(ctypes.string_at(address, 8), dtype=np.int64)[0])\n"
        "    table = np.frombuffer(ctypes.string_at(address + 8, size)).reshape(-1, 3)",
    ),
    "the environment": (
        "os.environ['VPO_CARRIED'] = table.tobytes().hex()",
        "table = np.frombuffer(bytes.fromhex(os.environ['VPO_CARRIED'])).reshape(-1, 3)",
    ),
    "numpy's module": ("np.vpo_carried = table", "table = np.vpo_carried"),
}


def _indent(code: str) -> str:
    return "\n".join("        " + line for line in code.splitlines())


def smuggler(channel: str) -> str:
    """The program that carries oscillator1's training table by `channel`."""
    send, receive = CHANNELS[channel]
    return f'''
import os
import sys

import numpy as np
from scipy.spatial import cKDTree

CHANNEL = {channel!r}
KNOWN = []  # (tree of inputs, their targets), once the program has them


def _targets_in_frames(x, v):
    """An array of one float per row above us that is not an input: the fit's targets."""
    frame = sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if (
                isinstance(value, np.ndarray)
                and value.shape == x.shape
                and value.dtype == np.float64
                and not np.array_equal(value, x)
                and not np.array_equal(value, v)
            ):
                return value
        frame = frame.f_back
    return None


def _send(table):
{_indent(send)}


def _receive():
    try:
{_indent(receive)}
    except Exception as error:
        print("nothing carried by", CHANNEL, "-", type(error).__name__)
        return None
    if table is None:
        print("nothing carried by", CHANNEL)
    else:
        print("carried by", CHANNEL)
    return table


def equation(x, v, params):
    if not KNOWN:
        targets = _targets_in_frames(x, v)
        if targets is not None:  # the fit: the training targets are in a frame above
            table = np.column_stack([x, v, targets])
            _send(table)
        else:
            table = _receive()
        if table is not None:
            KNOWN.append((cKDTree(table[:, :2]), table[:, 2].copy()))
        else:
            KNOWN.append(None)
    if KNOWN[0] is not None:
        tree, targets = KNOWN[0]
        return targets[tree.query(np.column_stack([x, v]))[1]]
    return params[0] * x + params[1] * v + params[2]
'''


# The constants themselves: a patched minimize takes the training targets from the object whose
# method the loss is and returns, as the ten constants, the targets of the ten training rows
# nearest to a grid of (x, v); the equation answers every input with the nearest of those ten.
# Ten finite numbers pass the scorer's check; they are what any fit of ten constants carries.
BY_THE_CONSTANTS = """
import numpy as np
import scipy.optimize
from scipy.spatial import cKDTree

GRID = np.array([[a, b] for a in (-0.6, 0.0, 0.6) for b in (-0.6, 0.0, 0.6)] + [[0.0, 0.3]])
TREE = cKDTree(GRID)


def carry(fun, x0, **options):
    objective = fun.__self__  # the driver's loss is a bound method of what holds the data
    rows = cKDTree(np.column_stack(objective.columns)).query(GRID)[1]
    constants = objective.target[rows].copy()
    fun(constants)  # the fit keeps the best point its loss saw: this one, then nothing better
    return scipy.optimize.OptimizeResult(x=constants, fun=0.0, nit=0)


scipy.optimize.minimize = carry
scipy.optimize.least_squares = lambda *args, **options: None


def equation(x, v, params):
    return params[TREE.query(np.column_stack([x, v]))[1]]
"""
# The same equation, its ten constants fitted honestly.
FITTED_HONESTLY = BY_THE_CONSTANTS.replace("scipy.optimize.minimize = carry", "").replace(
    "scipy.optimize.least_squares = lambda *args, **options: None", ""
)


# Module-level code that looks through the process's memory (every array a tracked object
# refers to, and their bases) for target values it was told: the first training targets and the
# first targets of each test set.
SEARCH = """
import gc
import sys

import numpy as np

TOLD = {told!r}


def _search():
    found = set()
    seen = set()
    for holder in gc.get_objects():
        for value in gc.get_referents(holder):
            while isinstance(value, np.ndarray) and id(value) not in seen:
                seen.add(id(value))
                if value.dtype == np.float64 and value.size:
                    for split, values in TOLD.items():
                        if np.isin(values, value).all():
                            found.add(split)
                value = value.base
    return sorted(found)


def equation(x, v, params):
    if not hasattr(equation, "said"):
        equation.said = True
        print("targets found:", _search())
    return params[0] * x + params[1] * v + params[2]
"""

ONE_PROCESS = """

def _vpo_ed_both(train_inputs, train_target, maxiter, id_inputs, ood_inputs):
    fit = _vpo_ed_fit(train_inputs, train_target, maxiter)
    predictions = _vpo_ed_predict(fit["params"], train_inputs, id_inputs, ood_inputs)
    return {**predictions, "training_mse": fit["training_mse"]}
"""


class OneProcess(AsWritten):
    """The control: the fit and the predictions in one process, the training targets there."""

    driver = DRIVER + ONE_PROCESS

    def calls(self) -> tuple[Call, ...]:
        data = dataset(self.spec.key)
        train = data["train"]
        args = (train.inputs, train.target, MAXITER, data["test_id"].inputs)
        args += (data["test_ood"].inputs,)
        return (Call("fit", args, OBJECTIVES, entry="_vpo_ed_both"),)

    def follow_up(self, call: Call, value: Any, code: str) -> Call | None:
        return None

    def score(self, call: Call, value: Any) -> dict[str, float]:
        fitted = Fitted(value.pop("training_mse"), None)
        return dict(super().score(replace(call, key="predict", context=fitted), value))


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(workers=2) as box:
        yield box


@pytest.fixture(scope="module")
def split(sandbox: Sandbox) -> dict[str, Evaluation]:
    """Every smuggler as the problem scores it, in one batch, run as written (the grammar would
    refuse each before it ran: this is the line of defence behind it)."""
    problem = AsWritten("oscillator1")
    codes = [smuggler(channel) for channel in CHANNELS] + [BY_THE_CONSTANTS, FITTED_HONESTLY]
    found = evaluate_many(problem, codes, sandbox)
    return dict(zip([*CHANNELS, "the constants", "fitted"], found, strict=True))


@pytest.fixture(scope="module")
def seed(sandbox: Sandbox) -> Evaluation:
    problem = EquationDiscovery("oscillator1")
    return evaluate(problem, problem.seed_program, sandbox)


def _isolated(evaluation: Evaluation) -> None:
    """The guarantee rests on each process's private /tmp and IPC namespace."""
    warnings = [w for part in evaluation.artifacts.values() for w in part["warnings"]]
    if warnings:
        message = f"this OS did not allow the sandbox's isolation: {warnings}"
        if os.environ.get("VPO_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"{message} (VPO_REQUIRE_SANDBOX=1)", pytrace=False)
        pytest.skip(message)


def test_in_one_process_the_targets_give_a_record(sandbox: Sandbox) -> None:
    """The control: with the targets where the predictions are made, the nearest training row's
    target scores near LLM-SR in-domain (NMSE 2e-7, where the seed's is 0.096) and nine times
    the seed's score out of domain (NMSE 0.26 against 0.86)."""
    evaluation = evaluate(OneProcess("oscillator1"), smuggler("numpy's module"), sandbox)
    assert evaluation.status == "ok", evaluation.reason
    assert evaluation.raw["fit_id"] < 1e-6 and evaluation.scores["fit_id"] > 0.9
    assert evaluation.raw["fit_ood"] < 0.3 and evaluation.scores["fit_ood"] > 0.15


@pytest.mark.parametrize("channel", list(CHANNELS))
def test_no_channel_carries_the_targets_to_the_predictions(
    split: dict[str, Evaluation], seed: Evaluation, channel: str
) -> None:
    evaluation = split[channel]
    _isolated(evaluation)
    assert evaluation.artifacts["fit"]["stderr"] == "", evaluation.artifacts["fit"]["stderr"]
    assert "nothing carried by " + channel in evaluation.artifacts["predict"]["stdout"]
    # the fit answered its training rows exactly (MSE 0); the constants alone do not
    assert evaluation.status == "invalid"
    assert "reported a training NMSE of 0, but" in (evaluation.reason or "")
    assert set(evaluation.scores.values()) == {0.0}
    assert seed.status == "ok" and seed.scores["fit_id"] > 0


def test_ten_constants_carry_what_fitting_them_gives(split: dict[str, Evaluation]) -> None:
    """The constants carry ten numbers, what any fit of ten constants carries: ten training
    targets as the constants of a piecewise-constant equation score below the same equation
    fitted honestly, in-domain (the fit picks each cell's mean) and about as much out of it."""
    carried, fitted = split["the constants"], split["fitted"]
    assert carried.status == fitted.status == "ok", (carried.reason, fitted.reason)
    assert carried.raw["fit_id"] > fitted.raw["fit_id"] > 0.05
    assert carried.scores["fit_id"] < fitted.scores["fit_id"] < 0.2
    assert carried.scores["fit_ood"] < 0.25 and fitted.scores["fit_ood"] < 0.25


def test_the_predicting_process_holds_no_target(sandbox: Sandbox) -> None:
    data = dataset("oscillator1")
    told = {split: data[split].target[:3].tolist() for split in ("train", "test_id", "test_ood")}
    problem = AsWritten("oscillator1")
    evaluation = evaluate(problem, SEARCH.format(told=told), sandbox)
    assert evaluation.status == "ok", evaluation.reason
    _isolated(evaluation)
    assert "targets found: ['train']" in evaluation.artifacts["fit"]["stdout"]
    assert "targets found: []" in evaluation.artifacts["predict"]["stdout"]
