"""The compact form: an equation candidate written as the expression `equation` returns.

The model writes tens of tokens per candidate instead of a whole program; the harness builds
the program, shows the parent and drafts as expressions, and refuses what is not one with a
reason the model can read. Scores are the whole program's, through the same sandbox."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.config.errors import UserError
from harness.evaluation.calls import Limits
from harness.evaluation.evaluate import evaluate
from harness.evaluation.sandbox import Sandbox
from harness.evolution.iteration import classify_group
from harness.evolution.prompts import ANSWER_START
from harness.llm.base import Sampling
from harness.records import code_hash
from problems.circle_packing import CirclePacking
from problems.equation_discovery import SPECS, EquationDiscovery

OSCILLATOR = EquationDiscovery("oscillator1")
# Cubic stiffness, cubic damping and an x*v term (tests/test_equation_discovery.py's BETTER).
BETTER = "params[0] * x + params[1] * v**3 + params[2] * x**3 + params[3] * x * v"


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(workers=2) as box:
        yield box


@pytest.mark.parametrize("key", sorted(SPECS))
def test_the_seed_is_its_expression_and_back(key: str) -> None:
    problem = EquationDiscovery(key)
    part = problem.compact.part(problem.seed_program)
    assert part is not None and "def" not in part
    again = problem.compact.part(problem.compact.program(part))
    assert again == part
    # The statement asks for an expression in this problem's inputs and says how it scores.
    for name, _ in SPECS[key].inputs:
        assert name in problem.compact.statement
    assert "return <the expression>" in problem.compact.statement
    for words in ("fit_id", "fit_ood", "simplicity", "starting equation scores", SPECS[key].ood):
        assert words in problem.compact.statement


def test_spellings_of_one_expression_are_one_program() -> None:
    form = OSCILLATOR.compact
    spellings = [
        "params[0]*x + params[1]*v**3",
        "return params[0] * x + (params[1] * v ** 3)  # cubic damping",
        "(params[0] * x\n + params[1] * v**3)",
    ]
    assert len({code_hash(form.program(text)) for text in spellings}) == 1


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("params[0] * y + params[1]", "`y`: only the inputs (x, v), params and np"),
        ("params[0] * x +", "not one Python expression"),
        ("x = params[0]", "an assignment outside `equation`"),
        ("scipy.sin(x) * params[0]", "`scipy.sin(...)` is not allowed: the functions are np.abs"),
        ("x" * 5000, "over 4,000 characters"),
        ("sum(params[i] * x**i for i in range(3))", "`sum(...)` is not allowed"),
        ("abs(params[3]) * (lambda u: u * v)(x)", "is not allowed"),
    ],
)
def test_what_is_not_an_expression_is_refused_with_its_reason(text: str, words: str) -> None:
    with pytest.raises(ValueError) as caught:
        OSCILLATOR.compact.program(text)
    message = str(caught.value)
    assert words in message and "\n" not in message


def test_an_expression_scores_as_its_whole_program(sandbox: Sandbox) -> None:
    limits = Limits(wall_seconds=OSCILLATOR.time_limit, memory_mb=OSCILLATOR.memory_mb)
    compact = evaluate(OSCILLATOR, OSCILLATOR.compact.program(BETTER), sandbox, limits)
    whole = evaluate(
        OSCILLATOR,
        "import numpy as np\n\n\ndef equation(x, v, params):\n    return " + BETTER + "\n",
        sandbox,
        limits,
    )
    assert compact.status == whole.status == "ok"
    assert compact.scores == pytest.approx(whole.scores, rel=1e-9)
    assert compact.scores["fit_id"] > 0.7


def test_a_group_of_expressions_becomes_programs_or_reasons() -> None:
    answer = (
        f"<candidate_1>\n{BETTER}\n</candidate_1>\n"
        "<candidate_2>\n```python\nparams[0] * np.sin(x) + params[1] * v\n```\n</candidate_2>\n"
        "<candidate_3>\nparams[0] * q\n</candidate_3>\n"
    )
    seed = OSCILLATOR.seed_program
    group = classify_group([answer], 3, seed, set(), "equation", OSCILLATOR.compact.program)
    first, second, third = group.rollouts[0].candidates
    assert first.outcome == second.outcome == "new"
    assert first.code.startswith("import numpy as np") and "v ** 3" in first.code
    assert "np.sin(x)" in second.code
    assert third.outcome == "unparsed" and "`q`" in third.reason
    assert group.rollouts[0].status == "partial"
    # The parent's own expression is the parent again: never evaluated.
    again = classify_group(
        ["<candidate_1>\nparams[0]*x + params[1]*v + params[2]\n</candidate_1>"],
        1,
        seed,
        set(),
        "equation",
        OSCILLATOR.compact.program,
    )
    assert again.rollouts[0].candidates[0].outcome == "duplicate"


def test_the_prompt_shows_expressions_and_asks_for_them(tmp_path: Path) -> None:
    """Through the campaign's own path: stored programs are whole, the next prompt shows the
    parent and a draft as expressions, and it is much shorter than the whole-program one."""
    from harness.evolution.prompts import build_prompt

    text = f"<candidate_1>\n{BETTER}\n</candidate_1>\n<candidate_2>\nparams[0] * x\n</candidate_2>"
    with Sandbox(workers=2) as box:
        store, campaign, seed = _answered(tmp_path, text, box)
    programs = store.programs(campaign.campaign_id, origin="llm")
    assert len(programs) == 2 and all("def equation(x, v, params):" in p.code for p in programs)
    best = max(programs, key=lambda p: p.scores["fit_id"])
    compact = build_prompt(OSCILLATOR, best, [seed], 3, compact=campaign.compact)[1]["content"]
    whole = build_prompt(OSCILLATOR, best, [seed], 3)[1]["content"]
    assert "# Current expression" in compact and "# Other expressions, for ideas" in compact
    assert "params[0] * x + params[1] * v ** 3" in compact
    assert "params[0] * x + params[1] * v + params[2]" in compact  # the seed, as a draft
    assert "def equation(x, v, params):" not in compact  # no program is shown whole
    assert "3 expressions" in compact and "<candidate_2>" in compact
    assert len(compact) < len(whole)
    # The compact statement says how an expression is scored: no second list of objectives,
    # and scores without raw values (which a small model copied as its candidates); the ask
    # is to build on the current expression, not to write forms unlike each other.
    assert "# Objectives" in whole and "# Objectives" not in compact
    assert "(raw " in whole and "(raw " not in compact
    assert f"fit_id {best.scores['fit_id']:.4f}," in compact
    assert campaign.compact.advice and campaign.compact.advice in compact
    assert "genuinely different form" not in compact
    # The answer is opened for the model: the compact prompt ends in the assistant's turn,
    # whose first candidate starts as a term added to the current expression; the example
    # candidates show that form.
    opened = build_prompt(OSCILLATOR, best, [seed], 3, compact=campaign.compact)
    assert opened[-1] == {"role": "assistant", "content": ANSWER_START + "\n+"}
    assert "<candidate_1>\n+ params[3] * ...a new term...\n</candidate_1>" in compact
    assert build_prompt(OSCILLATOR, best, [seed], 3)[-1]["role"] == "user"


def test_an_opened_answer_is_continued_and_read_whole(tmp_path: Path) -> None:
    """The prompt's tokens end inside the assistant's opened turn, the completion's text starts
    with the opening (so it parses as the tags it is), and its tokens are the model's alone."""
    from harness.llm import make_generator
    from harness.llm.base import chat_prompt_ids

    generator = make_generator("transformers", "smollm2", dtype="float32")
    try:
        tokenizer = generator.tokenizer
        asked = [{"role": "user", "content": "Write an expression."}]
        opened = [*asked, {"role": "assistant", "content": ANSWER_START}]
        plain_ids = chat_prompt_ids(tokenizer, asked)
        opened_ids = chat_prompt_ids(tokenizer, opened)
        assert opened_ids[: len(plain_ids)] == plain_ids
        assert tokenizer.decode(opened_ids[len(plain_ids) :]) == ANSWER_START
        sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens=6, seed=5)
        [[completion]] = generator.generate([opened], 1, sampling)
        assert completion.text.startswith(ANSWER_START)
        assert list(completion.prompt_token_ids or ()) == opened_ids
        generated = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        assert completion.text == ANSWER_START + generated
    finally:
        generator.close()
    # What a model continuing the opening writes is read like a fully tagged answer.
    continued = ANSWER_START + f"\n{BETTER}\n</candidate_1>"
    group = classify_group(
        [continued], 1, OSCILLATOR.seed_program, set(), expand=OSCILLATOR.compact.program
    )
    assert group.rollouts[0].status == "ok"


@pytest.mark.parametrize(
    ("text", "expression"),
    [
        ("y = params[0] * x + params[1] * v", "params[0] * x + params[1] * v"),
        ("a = x * v\ny = params[0] * a + params[1]", "params[0] * (x * v) + params[1]"),
        ("acc: float = params[0] * np.sin(x)", "params[0] * np.sin(x)"),
        ("    m = params[0] * x\n    return m + numpy.cos(v)", "params[0] * x + np.cos(v)"),
        ("params[0] * sin(x) + math.pi * abs(v)", "params[0] * np.sin(x) + np.pi * np.abs(v)"),
    ],
)
def test_what_can_mean_one_expression_only_is_read_as_it(text: str, expression: str) -> None:
    """ "The expression alone" as a 0.5B model often writes it: `y = ...` (the expression the
    last assignment binds, as in `equation`'s body), the body of `equation` without its `def`,
    `numpy.` or `math.` for np, `sin(x)` for np.sin."""
    from problems.equation_discovery import grammar

    assert grammar.read(text, ("x", "v")).text == expression


def test_a_problem_without_a_compact_form_is_a_one_line_error() -> None:
    from harness.config.settings import build
    from harness.evolution.loop import compact_form

    problem = CirclePacking()
    config = build({"problem": problem.name, "form": "compact"})
    with pytest.raises(UserError, match="has no compact form") as caught:
        compact_form(config, problem)
    assert "\n" not in str(caught.value)
    with pytest.raises(UserError, match="'form' must be program or compact"):
        build({"problem": problem.name, "form": "expression"})


def test_a_term_after_plus_is_added_to_the_parent(tmp_path: Path) -> None:
    """A candidate `+ <term>` (the form's opening) is the parent's expression with the term
    added: through the campaign's path it is stored and scored as that whole expression, its
    params renumbered past the parent's where they collide."""
    # What the model continues from the opened answer `<candidate_1>\n+`.
    text = (
        f"{ANSWER_START}\n+ params[0] * x * v\n</candidate_1>\n"
        "<candidate_2>\n+ params[9] * v ** 3\n</candidate_2>"
    )
    with Sandbox(workers=2) as box:
        store, campaign, seed = _answered(tmp_path, text, box)
        limits = Limits(wall_seconds=float(OSCILLATOR.time_limit), memory_mb=OSCILLATOR.memory_mb)
        written_out = "params[0] * x + params[1] * v + params[2] + params[3] * x * v"
        direct = evaluate(OSCILLATOR, OSCILLATOR.compact.program(written_out), box, limits)
    programs = store.programs(campaign.campaign_id, origin="llm")
    stored = {OSCILLATOR.compact.part(p.code): p for p in programs}
    cubic = "params[0] * x + params[1] * v + params[2] + params[9] * v ** 3"
    assert set(stored) == {written_out, cubic}
    for name, value in direct.scores.items():
        assert stored[written_out].scores[name] == value
    assert stored[written_out].scores["fit_id"] > seed.scores["fit_id"] + 0.01


def test_an_addition_needs_an_expression_to_add_to() -> None:
    read = OSCILLATOR.compact.reader("this parent is not an expression (")
    with pytest.raises(ValueError, match="write a whole expression"):
        read("+ params[3] * x * v")
    # A whole expression is read as ever, a leading minus included.
    assert "return -params[0] * x" in read("-params[0] * x")
    # Against the seed, the renumbered params must fit in ten.
    full = " + ".join(f"params[{k}] * x ** {k}" for k in range(10))
    with pytest.raises(ValueError, match="more than 10 params"):
        OSCILLATOR.compact.reader(OSCILLATOR.compact.program(full))("+ params[0] * v")


def _answered(tmp_path: Path, text: str, box: Sandbox) -> tuple[Any, Any, Any]:
    """A compact campaign (m = 2) whose seed got `text` as its one rollout, evaluated and
    stored through the campaign's own path: (store, campaign, seed)."""
    from harness.config.settings import build
    from harness.evolution.iteration import SampledIteration
    from harness.evolution.loop import prepare
    from harness.evolution.recording import evaluate_and_store
    from harness.evolution.selection import Selection
    from harness.llm import Completion
    from harness.store import Store

    config = build(
        {"problem": OSCILLATOR.name, "candidates": 2, "group_size": 1, "form": "compact"}
    )
    store = Store.open(tmp_path / "campaign.db")
    campaign_id = store.create_campaign("compact", OSCILLATOR.name, config.to_dict(), 0)
    campaign = prepare(config, store, OSCILLATOR, campaign_id, box)
    seed = store.program(campaign.seed_id)
    completion = Completion(text, (1, 2), None, "stop", (7, 8))
    prompt = [{"role": "user", "content": "improve"}]
    sampled = SampledIteration(0, Selection(0, seed.id, ()), seed, prompt, [completion], [])
    list(evaluate_and_store(campaign, [sampled]))
    return store, campaign, seed
