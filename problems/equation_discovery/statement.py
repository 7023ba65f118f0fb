"""The statements the model reads for equation discovery: what to write (a whole program or the
expression alone) and how it is fitted and scored. Templates, filled per problem by
`EquationDiscovery` (problems/equation_discovery/__init__.py)."""

# What the model writes: a whole program (`form = "program"`) or the expression alone.
PROGRAM_ASK = """\
Find the mathematical form of {subject},
given data on {given}. Write a Python function

    def equation({signature}) -> np.ndarray

{arguments}
    params: an array of {nparams} numeric constants (see below)
It returns the {target} for each observation: an array with one value per row of the inputs.
Its body is assignments to names and one final `return`, built only from the inputs,
params[0] ... params[{last}] (each with a number as its index), numbers, + - * / ** and {functions};
no other imports, calls, loops, conditions or helper functions.
"""

EXPRESSION_ASK = """\
Find the mathematical form of {subject},
given data on {given}. Write it as one Python expression, the body of

    def equation({signature}) -> np.ndarray:
        return <the expression>

{arguments}
    params: an array of {nparams} numeric constants (see below)
The expression gives the {target} for each observation (one value per row of the inputs),
using only the inputs, params[0] ... params[{last}], numbers, + - * / ** and {functions},
for instance `{example}` (a form, not an answer).
"""

SCORING = """
You do not choose the constants. A fixed fitting step sets `params` by minimising the mean
squared error on the training data: scipy's BFGS from all ones (numerical gradients, at most
{maxiter} iterations, as LLM-SR fits), then least squares on the residuals (Levenberg-Marquardt
and a trust-region method) from that result and from all ones, keeping the best; the same
program always gets the same constants. So write the structure of the
equation, a skeleton with params[0] ... params[{last}] where its constants belong; entries you
do not use are ignored. Think about the physical meaning of the variables: the starting
equation is linear, and the real one has terms it misses (powers, products of the inputs,
exponentials, trigonometric or rational terms). numpy is available
as np. The fit runs in its own process with a time limit of {limit:g}
seconds and evaluates the equation on {rows:,} rows some thousands of times, so keep it
vectorised. The predictions are then made in a fresh process from the fitted params alone, so
`equation` must compute the same values there as during the fit.

The fitted equation is then scored on held-out data by its normalised mean squared error,
NMSE = sum((prediction - y)^2) / sum((y - mean of y)^2), lower is better:
- fit_id: NMSE on test points from the training region;
- fit_ood: NMSE on test points outside it, {ood};
- simplicity: {half}/({half} + size), where size counts each operator, function call, number
  and params[k] of the returned expression once per use, names assigned before written out (a
  written constant costs what a fitted one does), times a share the fit earns: 0 at an
  in-domain NMSE of 1 or worse, all of it at {gate:.3g} or better, log-linear between.
Fit scores are logarithmic in the NMSE: 0 at 1 (what predicting the mean scores) or worse;
the starting equation scores {seed_id:.2f} (in-domain) and {seed_ood:.2f} (out-of-domain); 1 at
{best_id:.3g} and {best_ood:.3g}, the best published results; above 1 beats them. Every
prediction must be a finite real number.
"""
# The compact statement says the same in fewer words: its prompts are what a step trains on.
COMPACT_SCORING = """
You do not choose the constants: they are fitted to the training data (least squares from all
ones: BFGS, then Levenberg-Marquardt), so write the form of the equation with params[i] where
a constant belongs; unused entries are ignored. The starting equation is linear; the real one
has terms it misses (powers, products of the inputs, exponentials, trigonometric or rational
terms).

Scores are on held-out data, from NMSE = sum((prediction - y)^2) / sum((y - mean of y)^2) on a
log scale: 0 at NMSE 1 (predicting the mean), 1 at the best published result.
- fit_id: in the training region; fit_ood: outside it, {ood};
- simplicity: {half}/({half} + size), size = each operator, call, number and params[k] used;
  times a share the fit earns: 0 at in-domain NMSE 1, all of it at {gate:.3g} or better.
The starting equation scores {seed_id:.2f} (in-domain) and {seed_ood:.2f} (out-of-domain).
"""
DESCRIPTION = PROGRAM_ASK + SCORING
COMPACT_DESCRIPTION = EXPRESSION_ASK + COMPACT_SCORING
