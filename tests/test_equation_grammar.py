"""An equation candidate is an expression: the grammar accepts straight-line code over the inputs,
params[k], numbers, arithmetic and a fixed list of numpy functions, and refuses everything else
with a one-line reason before any process starts. The program that runs is the harness's
writing of the parsed expression; its size and family are read from the same tree. No answer,
however written, ends or stalls the campaign: the red-team's reproducers, random expressions of
the grammar and random text go through every trusted step and a real campaign."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest
from conftest import Replay
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config.settings import build
from harness.evaluation.evaluate import evaluate_many
from harness.evaluation.sandbox import Sandbox
from harness.evolution.iteration import BatchKeys, classify_group, new_program
from harness.evolution.loop import run_campaign
from harness.evolution.novelty import Novelty
from harness.store import Store
from problems.equation_discovery import EquationDiscovery, addition, grammar
from problems.equation_discovery.family import family_key

OSCILLATOR = EquationDiscovery("oscillator1")
INPUTS = ("x", "v")
HEADER = "import numpy as np\n\n\ndef equation(x, v, params):\n"
BETTER = "params[0] * x + params[1] * v ** 3 + params[2] * x ** 3 + params[3] * x * v"
# What the red-team found ended or stalled a campaign (issue 44).
REPRODUCERS = {
    "a sympy number that formatted as decimal.InvalidOperation": "np.exp(np.exp(100.0)) * x",
    "a power tower that stalled the family check": "x + 0 * 9 ** 9 ** 9",
    "1,200 nested unary minus signs (RecursionError)": "-" * 1200 + "x",
}


def read(text: str) -> grammar.Equation:
    return grammar.read(text, INPUTS)


# --- what is accepted, and the one program it becomes --------------------------------------


REWRITINGS = [
    BETTER,
    f"return {BETTER}  # the return is dropped",
    "(params[0]*x + params[1]*v**3) + (params[2]*x**3 + params[3]*x*v)",
    HEADER + f"    return {BETTER}\n",
    "def equation(x: np.ndarray, v: np.ndarray, params: np.ndarray) -> np.ndarray:\n"
    '    """The acceleration: a docstring is fine."""\n'
    "    stiffness = params[0] * x + params[2] * x ** 3\n"
    "    damping = params[1] * v ** 3\n"
    "    coupling: np.ndarray = params[3] * x * v\n"
    "    return stiffness + damping + coupling\n",
    '"""A module docstring."""\nimport numpy\n\n\ndef equation(x, v, params):\n'
    "    total = params[0] * x\n    total += params[1] * v ** 3\n"
    "    total += params[2] * x ** 3\n    total += params[3] * x * v\n    return total\n",
]


@pytest.mark.parametrize("text", REWRITINGS)
def test_every_writing_of_an_equation_is_one_size_and_one_family(text: str) -> None:
    """Assignments inlined, each params[k], operator and literal counted once per use: the same
    equation however written has one size (16: ten operators, two exponents, four params)."""
    equation = read(text)
    assert equation.size == 16
    assert family_key(text, INPUTS) == family_key(BETTER, INPUTS)
    program = OSCILLATOR.admit(text)
    assert OSCILLATOR.admit(program) == program  # idempotent: a stored program re-admits as is
    assert program.startswith("import numpy as np\n") and program.count("def ") == 1


def test_the_program_is_the_harness_writing_never_the_candidates_text() -> None:
    """Comments, docstrings, names and annotations never reach the program that runs."""
    written = REWRITINGS[4]
    program = OSCILLATOR.admit(written)
    for gone in ("stiffness", "coupling", "docstring", "np.ndarray", "->"):
        assert gone not in program
    assert ast.parse(program).body[-1].body[-1].value is not None  # type: ignore[attr-defined]
    assert program == OSCILLATOR.admit(read(written).text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("params[0] * x + params[1] * v + params[2]", 7),  # the seed: 2 products, 2 sums, 3 params
        ("x", 0),
        ("params[0] * x + params[0] * v", 5),  # one param used twice counts twice
        ("-1.5 * x", 2),  # a negative number is one literal
        ("np.sin(params[0] * x)", 3),  # a call, a product, a param
        ("np.pi * x", 2),
        (HEADER + "    a = params[0] * x\n    return a + a\n", 5),  # a = 2, used twice, + 1
        ("+x", 0),
    ],
)
def test_size_counts_each_use(text: str, expected: int) -> None:
    assert read(text).size == expected


def test_simplicity_is_half_at_ten_and_zero_without_a_size() -> None:
    assert grammar.simplicity(0) == 1.0 and grammar.simplicity(10) == 0.5
    assert grammar.simplicity(None) == 0.0


def test_numbers_are_floats_in_the_program_but_whole_exponents() -> None:
    """No integer arithmetic reaches the program: `9 ** 9 ** 9` would be an endless big-integer
    power there; as floats it is an overflow, at once."""
    assert read("2 * x ** 2 + 9 ** 9 ** 9").text == "2.0 * x ** 2 + 9.0 ** 9.0 ** 9"


# --- what is refused, with its reason ----------------------------------------------------------


REFUSED = {
    # the red-team's attacks on the stated fit and on the size
    "replacing the optimizer": (
        "import numpy as np\nimport scipy.optimize\n"
        "scipy.optimize.minimize = lambda *a, **k: None\n\n" + HEADER + "    return x\n",
        "an import outside `equation`",
    ),
    "code in a docstring run through exec": (
        '"""params[0] * x ** 3"""\nexec(__doc__)\n' + HEADER + "    return x\n",
        "an expression statement outside `equation`",
    ),
    "a decorator": (
        "import numpy as np\n\n@staticmethod\ndef equation(x, v, params):\n    return x\n",
        "may not be decorated",
    ),
    "a dummy last argument": (
        "def equation(x, v, params, dummy=None):\n    return dummy[0] * x\n",
        "takes no defaults",
    ),
    "another name for params": (
        "def equation(x, v, p):\n    return p[0] * x\n",
        "exactly (x, v, params)",
    ),
    "an array call hiding ten terms": (
        "np.polynomial.polynomial.polyval2d(x, v, params)",
        "not allowed",
    ),
    "a reshape": ("np.sum(params.reshape(5, 2) * x)", "np.sum is not allowed"),
    "a helper function": (
        "def helper(x):\n    return x\n\n" + HEADER + "    return helper(x)\n",
        "a function outside `equation`",
    ),
    "a large integer holding code": (
        "x + 10 ** 7 * 123456789012345678901234567890",
        "within +-1e+06",
    ),
    "a computed index": ("params[int(x[0])] * x", "index params with a number"),
    "a slice": ("params[2:5] * x", "index params with a number"),
    "a comprehension": ("sum(params[i] * x ** i for i in range(3))", "`sum(...)` is not allowed"),
    "a lambda": ("(lambda u: u)(x)", "is not allowed"),
    "a conditional": ("x if v else 1", "a conditional expression is not allowed"),
    "a comparison": ("(x > 0) * params[0]", "a comparison is not allowed"),
    "an attribute": ("x.T * params[0]", "`x.T` is not allowed"),
    "a string": ("'x' * 3", "str literals are not allowed"),
    "a keyword argument": ("np.power(x, 2, out=x)", "np.power takes 2 arguments, no keywords"),
    "a loop in the body": (
        HEADER + "    for i in range(3):\n        x = x * 2\n    return x\n",
        "a loop",
    ),
    "no return": (HEADER + "    y = x\n", "must end with `return"),
    "an unknown name": ("params[0] * y", "the expression uses `y`"),
    "a walrus": ("(y := x) * params[0]", "`:=` is not allowed"),
    "a NUL byte": ("x\x00", "NUL byte"),
    "module-level code": ("import numpy as np\nprint(1)\n" + HEADER + "    return x\n", "outside"),
    "an import inside": (HEADER + "    import os\n    return x\n", "an import in `equation`"),
    "assigning params": (HEADER + "    params = x\n    return x\n", "`params` may not be assigned"),
    "too long": ("x + " * 2000 + "x", "over 4,000 characters"),
    "too many terms once inlined": (
        HEADER
        + "".join(f"    a{k} = a{k - 1} * a{k - 1}\n" for k in range(1, 12)).replace("a0", "x")
        + "    return a11\n",
        "over 400 terms",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_is_not_an_equation_is_refused_with_one_line(case: str) -> None:
    text, words = REFUSED[case]
    with pytest.raises(grammar.Refused) as refused:
        OSCILLATOR.admit(text)
    reason = str(refused.value)
    assert words in reason, reason
    assert "\n" not in reason and len(reason) < 500
    assert family_key(text, INPUTS) is None and OSCILLATOR.family(text) is None


def test_vpo_eval_refuses_every_non_expression_program(tmp_path: Path) -> None:
    """`vpo eval` says why in one line, exit 1, and runs nothing."""
    import subprocess
    import sys

    program = tmp_path / "hostile.py"
    program.write_text(REFUSED["replacing the optimizer"][0])
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "eval", "equation_discovery", str(program)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "refused before running: an import outside `equation`" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


# --- no answer ends or stalls a campaign -------------------------------------------------------


@pytest.mark.parametrize("case", list(REPRODUCERS))
def test_the_reproducers_pass_every_trusted_step(case: str) -> None:
    text = REPRODUCERS[case]
    _every_trusted_step(text)


def _every_trusted_step(text: str) -> None:
    """Parse, compact form, family, size, novelty and classification of one candidate text:
    each either answers or refuses; nothing raises."""
    try:
        program = OSCILLATOR.compact.program(text)
    except ValueError as refused:
        assert "\n" not in str(refused)
        program = None
    OSCILLATOR.family(text)
    memory = Novelty("equation", OSCILLATOR.family, near=0.9)
    if program is not None:
        assert grammar.read(program, INPUTS).size >= 0
        memory.add(program, "a" * 64, 0)
    answer = f"<candidate_1>\n{text}\n</candidate_1>\n<candidate_2>\n{BETTER}\n</candidate_2>"
    group = classify_group(
        [answer, text],
        2,
        OSCILLATOR.seed_program,
        set(),
        "equation",
        OSCILLATOR.compact.program,
        family=OSCILLATOR.family,
        memory=memory,
        batch=BatchKeys(),
    )
    for rollout in group.rollouts:
        for candidate in rollout.candidates:
            assert candidate.outcome in ("new", "duplicate", "unparsed")


LEAVES = st.one_of(
    st.sampled_from(["x", "v", "np.pi", "np.e"]),
    st.integers(0, 9).map(lambda k: f"params[{k}]"),
    st.integers(0, 20).map(str),
    st.floats(-1e6, 1e6, allow_nan=False).map(repr),
)
UNARY = sorted(name for name, arity in grammar.FUNCTIONS.items() if arity == 1)
BINARY = sorted(name for name, arity in grammar.FUNCTIONS.items() if arity == 2)


def _extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "**"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        inner.map(lambda a: f"-{a}"),
        st.tuples(st.sampled_from(UNARY), inner).map(lambda t: f"np.{t[0]}({t[1]})"),
        st.tuples(st.sampled_from(BINARY), inner, inner).map(
            lambda t: f"np.{t[0]}({t[1]}, {t[2]})"
        ),
    )


EXPRESSIONS = st.recursive(LEAVES, _extend, max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(EXPRESSIONS)
def test_random_expressions_of_the_grammar_pass_every_step(text: str) -> None:
    """What the grammar generates it accepts (unless over its bounds), writes back stably and
    keys without failing, as an expression and as a program with an assignment."""
    try:
        equation = read(text)
    except grammar.Refused as refused:
        assert "nested over" in str(refused) or "over 400" in str(refused), refused
        return
    assert read(equation.text).text == equation.text
    as_program = HEADER + f"    value = {text}\n    return value\n"
    assert read(as_program).text == equation.text and read(as_program).size == equation.size
    key = family_key(text, INPUTS)
    assert key is None or isinstance(key, str)
    _every_trusted_step(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="xv+-*/() .0123456789paramsnpiexp[]=\n:defrtun,'\"", max_size=120))
def test_random_text_passes_every_step(text: str) -> None:
    try:
        read(text)
    except grammar.Refused as refused:
        assert "\n" not in str(refused)
    _every_trusted_step(text)


def test_a_campaign_records_every_hostile_answer_and_finishes(tmp_path: Path) -> None:
    """The reproducers, random grammar expressions and random text through the real loop on
    oscillator1 (compact form, the sandbox, the store): the campaign finishes and every slot
    says what became of it."""
    rng = random.Random(44)
    pieces = [*REPRODUCERS.values(), *(text for text, _ in REFUSED.values())]
    pieces += [_random_expression(rng) for _ in range(10)]
    pieces += ["".join(rng.choice("xv+-*/()0123456789[]") for _ in range(30)) for _ in range(6)]
    completions = []
    for i in range(0, len(pieces), 3):
        chunk = pieces[i : i + 3]
        completions.append(
            "".join(f"<candidate_{k}>\n{p}\n</candidate_{k}>\n" for k, p in enumerate(chunk, 1))
        )
    iterations = (len(completions) + 3) // 4
    completions += [completions[0]] * (iterations * 4 - len(completions))
    config = build(
        {
            "problem": OSCILLATOR.name,
            "group_size": 4,
            "candidates": 3,
            "iterations": iterations,
            "workers": 2,
            "form": "compact",
        }
    )
    store = Store.open(tmp_path / "hostile.db")
    campaign_id = run_campaign(config, store, OSCILLATOR, generator=Replay(completions))
    assert store.get_campaign(OSCILLATOR.name).status == "finished"
    programs = store.programs(campaign_id, origin="llm")
    for program in programs:  # every stored program is the harness's writing of an equation
        assert OSCILLATOR.admit(program.code) == program.code
    scored = [p for p in programs if p.status == "ok"]
    assert scored
    # The stored campaign re-scores to the same numbers, bit for bit: the fit is deterministic.
    with Sandbox(workers=2) as sandbox:
        again = evaluate_many(OSCILLATOR, [p.code for p in scored], sandbox)
    for program, evaluation in zip(scored, again, strict=True):
        stored = new_program(program.code, evaluation)  # as the store keeps it: cases included
        assert evaluation.status == "ok" and stored.raw == program.raw, program.code


def _random_expression(rng: random.Random, depth: int = 0) -> str:
    if depth > 3 or rng.random() < 0.3:
        return rng.choice(["x", "v", f"params[{rng.randrange(10)}]", f"{rng.uniform(-3, 3):.2f}"])
    kind = rng.randrange(3)
    if kind == 0:
        op = rng.choice(["+", "-", "*", "/", "**"])
        return f"({_random_expression(rng, depth + 1)} {op} {_random_expression(rng, depth + 1)})"
    if kind == 1:
        return f"np.{rng.choice(UNARY)}({_random_expression(rng, depth + 1)})"
    return f"-{_random_expression(rng, depth + 1)}"


def test_an_addition_extends_the_current_expression() -> None:
    inputs = ("x", "v")
    seed = "params[0] * x + params[1] * v + params[2]"
    # A free index is kept; one the current expression uses moves to the lowest free one.
    assert addition.extend(seed, "+ params[7] * x * v", inputs).text == (
        "params[0] * x + params[1] * v + params[2] + params[7] * x * v"
    )
    assert addition.extend(seed, "+ params[0] * x * v + params[1] * np.sin(v)", inputs).text == (
        "params[0] * x + params[1] * v + params[2] + params[3] * x * v + params[4] * np.sin(v)"
    )
    # A minus after the plus subtracts; the whole is read again, so spellings are one text.
    assert addition.extend(seed, "+ -params[2] * x**2", inputs).text == (
        "params[0] * x + params[1] * v + params[2] - params[3] * x ** 2"
    )
    with pytest.raises(grammar.Refused, match="starts with \\+"):
        addition.extend(seed, "params[3] * x", inputs)
    with pytest.raises(grammar.Refused, match="`y`"):
        addition.extend(seed, "+ params[3] * y", inputs)
    # The bounds hold for the sum: a term that takes it past them is refused.
    long = " + ".join(["x * v"] * (grammar.MAX_NODES // 3))
    with pytest.raises(grammar.Refused, match="over 40"):
        addition.extend(seed, "+ " + long, inputs)
