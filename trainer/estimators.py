"""The advantage estimators by name: what each takes, in one place, importable without torch.

An estimator is one function in `trainer/advantages.py` (registered in its ESTIMATORS under the
same name) and one entry here: whether it scores one candidate per rollout, whether its set
score can be measured against a reference (the discovery reward's `reward_reference`,
`slot_cost` and `gain`), which TrainConfig fields it takes and under which keyword, and a line
for help texts. The campaign settings (harness/config/training.py), `vpo train`'s checks, the
trainer's TrainConfig and compute_advantages all read this table; tests/test_advantages.py ties
it to ESTIMATORS and to the docs.
"""

from __future__ import annotations

from dataclasses import dataclass

# The options a set-score estimator takes from TrainConfig: (field, keyword).
_SET_SCORE = (("num_weights", "num_weights"), ("alpha", "alpha"), ("signed_gain", "signed"))


@dataclass(frozen=True)
class Spec:
    summary: str  # what it pays, in a few words
    single_candidate: bool = False  # m = 1: it scores one candidate per rollout
    measured: bool = False  # its set score takes a reference, a slot cost and a signed gain
    options: tuple[tuple[str, str], ...] = ()  # TrainConfig field -> the function's keyword
    random: bool = False  # it draws weightings: it takes the step's torch generator


SPECS: dict[str, Spec] = {
    "vpo": Spec(
        "VPO: the set's best candidate under Dirichlet weightings, averaged",
        measured=True,
        options=_SET_SCORE,
        random=True,
    ),
    "entropic": Spec(
        "TTT-Discover's entropic advantage on VPO's set score",
        measured=True,
        options=(*_SET_SCORE, ("kl_budget", "budget")),
        random=True,
    ),
    "grpo": Spec("GRPO on the vector's mean (m = 1)", single_candidate=True),
    "multi_rlvr": Spec("Multi-RLVR: GRPO on the mean summed over the distinct candidates"),
    "max_at_k": Spec(
        "max@k of the vector's mean, an unbiased share (m = 1)",
        single_candidate=True,
        options=(("k", "k"),),
    ),
    "gdpo": Spec("GDPO: each objective standardised in the group, summed (m = 1)", True),
    "maxrl": Spec("MaxRL: (r - mean) / mean of the vector's mean (m = 1)", True),
    "rw_grpo": Spec("GRPO on one Dirichlet weighting per group (m = 1)", True, random=True),
}

NAMES = tuple(SPECS)
SINGLE_CANDIDATE = tuple(name for name, spec in SPECS.items() if spec.single_candidate)
MEASURED = tuple(name for name, spec in SPECS.items() if spec.measured)


def one_of(names: tuple[str, ...]) -> str:
    """`a, b or c`: how a message lists the names."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def unknown(name: str) -> str | None:
    """Why `name` is no estimator (one line), or None: every check of a name says this."""
    return None if name in SPECS else f"advantage must be {one_of(NAMES)}, not {name!r}"
