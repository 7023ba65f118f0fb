"""Verdicts a candidate cannot write (issue 56, item 5).

A refereed call (`Sandbox.run(..., referee=...)`): the referee's value is the result, the
candidate's process (a fresh interpreter) holds none of the referee's arguments, not in its
frames, its objects or anywhere in its memory, cannot reach the referee's memory or descriptors,
and fails as a direct call would. For every problem whose sandbox returns an answer that trusted
code then checks, a forged result frame is only an answer: it scores what returning it scores,
and a forged claim of a record scores nothing. Equation discovery runs no text a candidate
wrote, so a forger is refused before any process starts. HumanEval and bin packing, whose holes
these were, have their own tests in test_humaneval.py and test_bin_packing.py.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator

import pytest

from harness.evaluation.calls import Limits, Referee
from harness.evaluation.evaluate import evaluate
from harness.evaluation.sandbox import Sandbox
from problems.api import Problem
from problems.autocorrelation import Autocorrelation
from problems.cap_set import CapSet
from problems.circle_packing import CirclePacking
from problems.equation_discovery import EquationDiscovery
from problems.heilbronn import Heilbronn
from problems.min_distance_ratio import MinDistanceRatio


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(workers=2) as pool:
        yield pool


DOUBLE = Referee(
    "def judge(values):\n    return [call_candidate('double', v) for v in values]\n", "judge"
)


def test_the_referee_makes_the_call_and_its_value_is_the_result(sandbox: Sandbox) -> None:
    code = "def double(x):\n    print('called with', x)\n    return 2 * x\n"
    outcome = sandbox.run(code, "double", ([1, 2.5, [3]],), referee=DOUBLE)
    assert outcome.status == "ok", outcome.reason
    assert outcome.value == [2, 5.0, [3, 3]]
    assert "referee" in outcome.isolation
    assert outcome.stdout.splitlines() == ["called with 1", "called with 2.5", "called with [3]"]


@pytest.mark.parametrize(
    "code",
    [
        "def double(x) return",
        "x = 1",
        "double = 3",
        "def double(x):\n    raise ValueError('no such number')\n",
        "import sys\ndef double(x):\n    sys.exit(2)\n",
        "import os\nos._exit(3)\n",
        "import ctypes\ndef double(x):\n    return ctypes.string_at(0)\n",
        "def double(x):\n    return object()\n",
        "def double(x):\n    while True:\n        pass\n",
    ],
    ids=[
        "syntax",
        "no entry",
        "not callable",
        "raises",
        "sys.exit",
        "exits at module level",
        "segfault",
        "not data",
        "endless",
    ],
)
def test_a_refereed_candidate_fails_as_a_direct_call_would(sandbox: Sandbox, code: str) -> None:
    limits = Limits(wall_seconds=3.0)
    direct = sandbox.run(code, "double", (1,), limits=limits)
    refereed = sandbox.run(code, "double", ([1],), limits=limits, referee=DOUBLE)
    assert direct.status != "ok"
    assert (refereed.status, refereed.reason) == (direct.status, direct.reason)


# Everything a candidate can look at for the referee's arguments: the frames above it, every
# object the collector tracks, every readable private page of its memory, and the referee's own
# process (its memory, its result pipe, signals). The secret's prefix is split in the source, so
# a hit is the secret only where the prefix is followed by its random part.
PROBE = textwrap.dedent(
    """
    import ctypes, gc, os, signal, sys

    PREFIX = "vpo-" + "secret:"

    def look(_):
        seen = {"frames": [], "objects": [], "memory": [], "referee": {}}
        frame = sys._getframe()
        while frame is not None:
            for value in frame.f_locals.values():
                text = repr(value)
                at = text.find(PREFIX)
                while at >= 0:
                    seen["frames"].append(text[at : at + 40])
                    at = text.find(PREFIX, at + 1)
            frame = frame.f_back
        for o in gc.get_objects():
            items = o.values() if isinstance(o, dict) else o if isinstance(o, list) else ()
            seen["objects"] += [x[:40] for x in items if isinstance(x, str) and PREFIX in x]
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                anonymous = len(fields) < 6 or fields[5] in ("[heap]", "[stack]")
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if fields[1].startswith("rw") and anonymous and end - start <= 1 << 26:
                    data = ctypes.string_at(start, end - start)
                    at = data.find(PREFIX.encode())
                    while at >= 0:
                        seen["memory"].append(data[at : at + 40].decode("latin-1"))
                        at = data.find(PREFIX.encode(), at + 1)
        others = [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != os.getpid()]
        for pid in others:
            for path in (f"/proc/{pid}/mem", f"/proc/{pid}/fd/3", f"/proc/{pid}/environ"):
                try:
                    os.close(os.open(path, os.O_RDONLY))
                    seen["referee"][path] = "opened"
                except OSError as exc:
                    seen["referee"][path] = exc.strerror
            for number in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGPIPE):
                os.kill(pid, number)
        seen["others"] = len(others)
        return seen
    """
)


def test_the_candidate_never_holds_the_referees_arguments(sandbox: Sandbox) -> None:
    secret = "vpo-secret:" + "7f3a9c0e5b21d4" * 2
    referee = Referee(
        "import time\n"
        "def judge(secret):\n"
        "    seen = call_candidate('look', 1)\n"
        "    time.sleep(0.2)  # the signals, had they any effect, have arrived\n"
        "    return [seen, secret]\n",
        "judge",
    )
    outcome = sandbox.run(PROBE, "look", (secret,), referee=referee)
    assert outcome.status == "ok", (outcome.reason, outcome.stderr)
    seen, echoed = outcome.value
    assert echoed == secret  # the referee held it, and ignored the signals
    assert seen["others"] == 1  # the referee, in the candidate's pid namespace
    for where in ("frames", "objects", "memory"):
        assert not any(secret in hit for hit in seen[where]), (where, seen[where])
    assert set(seen["referee"].values()) == {"Permission denied"}, seen["referee"]
    # the control: a direct call holds its arguments, and each look shows them
    direct = sandbox.run(PROBE, "look", (secret,))
    for where in ("frames", "objects", "memory"):
        assert any(secret in hit for hit in direct.value[where]), where


def test_the_candidate_cannot_write_the_result(sandbox: Sandbox) -> None:
    forger = (
        "import os\n"
        "try:\n"
        "    os.write(3, b'{\"value\": [1000000]}')\n"
        "    os._exit(0)\n"
        "except OSError as exc:\n"
        "    print('fd 3:', exc.strerror)\n"
        "def double(x):\n"
        "    return 2 * x\n"
    )
    direct = sandbox.run(forger, "double", (1,))
    assert direct.value == [1000000]  # a direct call's forgery is its answer, nothing more
    refereed = sandbox.run(forger, "double", ([1],), referee=DOUBLE)
    assert refereed.status == "ok" and refereed.value == [2]
    assert "fd 3: Bad file descriptor" in refereed.stdout


# A forger per problem whose sandbox returns an answer: the seed's entry computes the answer,
# then writes it on the result pipe itself and exits, instead of returning it.
FORGER = """

import json as _json
import os as _os

_honest = {entry}


def _plain(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def {entry}(*args):
    value = _plain(_honest(*args))
    if {forge}:
        _os.write(3, _json.dumps({{"value": value}}).encode())
        _os._exit(0)
    return value
"""

ANSWERS = [CirclePacking(), Heilbronn(), MinDistanceRatio(), Autocorrelation()]


@pytest.mark.parametrize("problem", ANSWERS, ids=lambda p: p.name)
def test_a_forged_answer_scores_what_returning_it_scores(
    sandbox: Sandbox, problem: Problem
) -> None:
    forged = problem.seed_program + FORGER.format(entry=problem.entry, forge=True)
    returned = problem.seed_program + FORGER.format(entry=problem.entry, forge=False)
    by_forgery, by_return = evaluate(problem, forged, sandbox), evaluate(problem, returned, sandbox)
    assert by_return.status == "ok", by_return.reason
    assert by_forgery.status == "ok", by_forgery.reason
    assert by_forgery.raw == by_return.raw and by_forgery.scores == by_return.scores


def test_a_forged_cap_set_is_scored_as_the_priorities_it_carries(sandbox: Sandbox) -> None:
    problem = CapSet()
    forger = (
        "import json, os\n"
        "def priority(el, n):\n"
        "    os.write(3, json.dumps({'value': [0.0] * 3 ** n}).encode())\n"
        "    os._exit(0)\n"
    )
    forged = evaluate(problem, forger, sandbox)
    seed = evaluate(problem, problem.seed_program, sandbox)
    assert forged.status == seed.status == "ok", (forged.reason, seed.reason)
    assert forged.raw == seed.raw == {f"n{n}": 2.0**n for n in range(3, 10)}


@pytest.mark.parametrize("problem", [*ANSWERS, CapSet()], ids=lambda p: p.name)
def test_a_forged_claim_of_a_record_scores_nothing(sandbox: Sandbox, problem: Problem) -> None:
    claim = {o.name: o.best_known * 1e9 for o in problem.objectives}
    forger = (
        "import json, os\n"
        f"os.write(3, json.dumps({{'value': {claim!r}}}).encode())\n"
        "os._exit(0)\n" + problem.seed_program
    )
    evaluation = evaluate(problem, forger, sandbox)
    assert evaluation.status == "invalid", evaluation.reason
    assert set(evaluation.scores.values()) == {0.0}


def test_equation_discovery_runs_no_forger_at_all(sandbox: Sandbox) -> None:
    """The harness writes the program from the expression it parsed: a forger's statements
    never reach a process."""
    problem = EquationDiscovery("oscillator1")
    forger = (
        "import json, os\n"
        "os.write(3, json.dumps({'value': [[1.0] * 10, 0.0]}).encode())\n"
        "os._exit(0)\n" + problem.seed_program
    )
    evaluation = evaluate(problem, forger, sandbox)
    assert evaluation.status == "invalid"
    assert "refused before running" in str(evaluation.reason)
    assert set(evaluation.scores.values()) == {0.0}
    assert json.dumps(evaluation.artifacts) == "{}"  # nothing ran
