"""The driver appended to a candidate's equation (never imported by the harness: its text follows
the program's, and the sandbox calls one of its two entries, each in a process of its own).

- `_vpo_ed_fit(train_inputs, train_target, maxiter)` fits `params` as LLM-SR does (scipy BFGS
  from ten ones on the training MSE, numerical gradients, scipy's default tolerances, at most
  `maxiter` iterations) and returns the ten fitted constants and the training MSE it reached.
- `_vpo_ed_predict(params, train_inputs, id_inputs, ood_inputs)` runs the equation with those
  constants on the three sets of inputs and returns the predictions.

Nothing here is trusted, and nothing needs to be: the fitting process holds the training
targets but returns only ten numbers, which the scorer checks; the predicting process, a fresh
one, never receives a target of any split; the scorer computes every error from the predictions
and its own targets, and refuses a fit whose training error the predictions do not reproduce.
A program that rewrites this driver, patches numpy or inspects its frames changes only what its
own process returns. So the driver only keeps honest programs working: numpy as np where the
program did not import it, fresh copies of the inputs on every call, one clear line when the
equation returns something that is not one real number per row.
"""

import builtins as _vpo_ed_builtins
import math as _vpo_ed_math
import warnings as _vpo_ed_warnings

import numpy as _vpo_ed_np
import scipy.optimize as _vpo_ed_optimize

_vpo_ed_NPARAMS = 10
_vpo_ed_program = _vpo_ed_builtins.globals()  # the module's namespace: the program's and ours


def _vpo_ed_equation():
    equation = _vpo_ed_program.get("equation")
    if not callable(equation):
        raise NameError("the program defines no function `equation`")
    # The statement says numpy is available as np: so it is, where the program did not import it.
    _vpo_ed_program.setdefault("np", _vpo_ed_np)
    return equation


def _vpo_ed_columns(inputs):
    """Contiguous copies of each input column."""
    return [inputs[:, j].copy() for j in range(inputs.shape[1])]


def _vpo_ed_run(equation, columns, params, rows):
    """equation(*columns, params) as float64 of shape (rows,), or an error saying what it gave."""
    value = equation(*[column.copy() for column in columns], params.copy())
    found = _vpo_ed_np.asarray(value)
    if found.dtype.kind not in "fiub":
        raise TypeError(f"equation returned {found.dtype} values, not real numbers")
    if found.shape != (rows,):
        raise ValueError(
            f"equation returned shape {found.shape} for {rows} rows; return one value per row"
        )
    return found.astype("float64")


def _vpo_ed_fit(train_inputs, train_target, maxiter):
    equation = _vpo_ed_equation()
    train = _vpo_ed_columns(train_inputs)
    target = train_target.copy()
    rows = target.shape[0]
    with _vpo_ed_np.errstate(all="ignore"), _vpo_ed_warnings.catch_warnings():
        _vpo_ed_warnings.simplefilter("ignore")

        def loss(params):
            residual = _vpo_ed_run(equation, train, params, rows) - target
            return float(residual @ residual) / rows

        fit = _vpo_ed_optimize.minimize(
            loss, [1.0] * _vpo_ed_NPARAMS, method="BFGS", options={"maxiter": maxiter}
        )
        params = _vpo_ed_np.asarray(fit.x, dtype="float64").copy()
        mse = loss(params)
    if not _vpo_ed_math.isfinite(mse):
        raise ValueError("the fitted equation's training error is not finite (NaN or inf)")
    shown = ", ".join(f"{p:.6g}" for p in params)
    print(f"fitted params: [{shown}]; {fit.nit} BFGS iterations; training MSE {mse:.6g}")
    return {"params": params, "training_mse": mse}


def _vpo_ed_predict(params, train_inputs, id_inputs, ood_inputs):
    equation = _vpo_ed_equation()
    predictions = {}
    with _vpo_ed_np.errstate(all="ignore"), _vpo_ed_warnings.catch_warnings():
        _vpo_ed_warnings.simplefilter("ignore")
        for split, inputs in (
            ("train", train_inputs),
            ("test_id", id_inputs),
            ("test_ood", ood_inputs),
        ):
            rows = inputs.shape[0]
            predictions[split] = _vpo_ed_run(equation, _vpo_ed_columns(inputs), params, rows)
    return predictions
