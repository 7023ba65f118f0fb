"""Problems: statements, seed programs, objectives and strict scorers.

They know nothing of the harness.
"""

from problems.api import (
    Anchor,
    Call,
    Evaluation,
    Infeasible,
    Objective,
    Problem,
    Status,
    combine,
)

__all__ = [
    "Anchor",
    "Call",
    "Evaluation",
    "Infeasible",
    "Objective",
    "Problem",
    "Status",
    "combine",
]
