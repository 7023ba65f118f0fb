"""The driver appended to a candidate's equation (never imported by the harness: its text follows
the program's, and the sandbox calls one of its two entries, each in a process of its own).

- `_vpo_ed_fit(train_inputs, train_target, maxiter)` fits `params` to the training data and
  returns the ten fitted constants and the training MSE they reach.
- `_vpo_ed_predict(params, train_inputs, id_inputs, ood_inputs)` runs the equation with those
  constants on the three sets of inputs and returns the predictions.

The fit (chosen by benchmarks/equation_fit.py, results/equation_fit.md) starts as LLM-SR fits:
scipy BFGS from ten ones on the training MSE, numerical gradients, scipy's tolerances, at most
`maxiter` iterations. From there it improves, by least squares on the residuals, which BFGS's
loose stop on the MSE (gtol 1e-5) leaves far from a skeleton's best:
1. Levenberg-Marquardt from the best point BFGS reached;
2. Levenberg-Marquardt from ten ones, and a trust-region fit (TRF, Jacobian-scaled) from them,
   which reach basins BFGS misses (a frequency, a stiffness of 60);
3. Levenberg-Marquardt once more from the best point of all.
Restarts from other fixed points were measured and left out: they improved no skeleton there.
Every evaluation of the equation is counted and the best finite training MSE seen is kept, so
the fit is never worse than BFGS alone, and an iterate that leaves the finite region (sqrt of a
negative constant, an overflow) never loses an earlier finite point. Each step after BFGS stops
on its own budget of evaluations, never on the clock, and nothing is random: the same program
gets the same constants bit for bit in every fresh process (the sandbox runs BLAS on one
thread).

Nothing here is trusted, and nothing needs to be: the fitting process holds the training
targets but returns only ten numbers, which the scorer checks; the predicting process, a fresh
one, never receives a target of any split; the scorer computes every error from the predictions
and its own targets, and refuses a fit whose training error the predictions do not reproduce.
So the driver only keeps honest programs working: numpy as np where the program did not import
it, fresh copies of the inputs on every call, one clear line when the equation returns
something that is not one real number per row.
"""

import builtins as _vpo_ed_builtins
import math as _vpo_ed_math
import warnings as _vpo_ed_warnings

import numpy as _vpo_ed_np
import scipy.optimize as _vpo_ed_optimize

_vpo_ed_NPARAMS = 10
# Evaluations of the equation each least-squares step may spend (a Levenberg-Marquardt iteration
# costs one evaluation per constant for its Jacobian, plus one). Converging steps measured took
# 12 to 560; a step that crawls (nearly redundant constants) stops at its budget. With BFGS's
# own 200 iterations (up to ~2,600 evaluations) a fit is at most ~5,800 evaluations.
_vpo_ed_BUDGET = 800
# A residual where the equation is not finite: rejected by either method as a step, and its
# square summed over rows stays finite.
_vpo_ed_FAR = 1e100
_vpo_ed_TOLERANCE = 1e-15  # ftol, xtol and gtol: stop at rounding, not before
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


class _vpo_ed_Spent(Exception):
    """A step's budget of evaluations is spent."""


class _vpo_ed_Objective:
    """The training error of params as LLM-SR computes it, every evaluation counted and the best
    finite one kept."""

    def __init__(self, equation, columns, target):
        self.equation, self.columns, self.target = equation, columns, target
        self.rows = target.shape[0]
        self.evaluations = 0
        self.limit = None  # evaluations at which the current step stops; None: no limit
        self.best_mse = _vpo_ed_math.inf
        self.best = None

    def residual(self, params):
        if self.limit is not None and self.evaluations >= self.limit:
            raise _vpo_ed_Spent
        self.evaluations += 1
        params = _vpo_ed_np.array(params, dtype="float64")
        residual = _vpo_ed_run(self.equation, self.columns, params, self.rows) - self.target
        mse = float(residual @ residual) / self.rows
        if mse < self.best_mse:  # False for NaN
            self.best_mse, self.best = mse, params
        return residual, mse

    def mse(self, params):
        """What BFGS minimises: LLM-SR's loss, NaN or inf where the equation is not finite."""
        return self.residual(params)[1]

    def residuals(self, params):
        """What least squares minimises: the residuals, FAR where they are not finite."""
        residual, mse = self.residual(params)
        if not _vpo_ed_math.isfinite(mse):
            return _vpo_ed_np.full(self.rows, _vpo_ed_FAR)
        return residual


def _vpo_ed_least_squares(objective, start, method, budget):
    """One least-squares step from `start`, stopped after `budget` evaluations; what it finds
    the objective keeps. A start where the equation is not finite is skipped, and so is a step
    the equation fails in (the fit keeps what it has)."""
    objective.limit = objective.evaluations + budget
    try:
        if not _vpo_ed_math.isfinite(objective.mse(start)):
            return
        _vpo_ed_optimize.least_squares(
            objective.residuals,
            start,
            method=method,
            x_scale="jac" if method == "trf" else 1.0,
            ftol=_vpo_ed_TOLERANCE,
            xtol=_vpo_ed_TOLERANCE,
            gtol=_vpo_ed_TOLERANCE,
            max_nfev=budget,
        )
    except Exception:  # Spent, or a failure at constants BFGS never tried: the best stands
        pass
    finally:
        objective.limit = None


def _vpo_ed_fit(train_inputs, train_target, maxiter):
    equation = _vpo_ed_equation()
    target = train_target.copy()
    objective = _vpo_ed_Objective(equation, _vpo_ed_columns(train_inputs), target)
    ones = _vpo_ed_np.ones(_vpo_ed_NPARAMS)
    with _vpo_ed_np.errstate(all="ignore"), _vpo_ed_warnings.catch_warnings():
        _vpo_ed_warnings.simplefilter("ignore")
        # LLM-SR's fit, unchanged; an equation that fails here fails the fit, as it does there
        bfgs = _vpo_ed_optimize.minimize(
            objective.mse, ones, method="BFGS", options={"maxiter": maxiter}
        )
        after_bfgs = objective.evaluations
        if objective.best is not None:
            _vpo_ed_least_squares(objective, objective.best, "lm", _vpo_ed_BUDGET)
        _vpo_ed_least_squares(objective, ones, "lm", _vpo_ed_BUDGET)
        _vpo_ed_least_squares(objective, ones, "trf", _vpo_ed_BUDGET)
        if objective.best is not None:
            _vpo_ed_least_squares(objective, objective.best, "lm", _vpo_ed_BUDGET)
    if objective.best is None:
        raise ValueError("the fitted equation's training error is not finite (NaN or inf)")
    params, mse = objective.best, objective.best_mse
    shown = ", ".join(f"{p:.6g}" for p in params)
    print(
        f"fitted params: [{shown}]; training MSE {mse:.6g}; {objective.evaluations} evaluations"
        f" ({bfgs.nit} BFGS iterations in {after_bfgs}, then least squares)"
    )
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
