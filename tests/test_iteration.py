"""Classifying an iteration's candidates (new, duplicate, unparsed) and the records stored."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.evolution.iteration import (
    BatchKeys,
    Candidate,
    ParsedGroup,
    classify_group,
    rollout_records,
)
from harness.evolution.novelty import Novelty
from harness.evolution.parsing import format_full, parse_completion
from harness.llm import Completion
from harness.records import code_hash, entry_key
from problems.api import Evaluation

PARENT = "def f():\n    return 1\n"


def answer(*programs: str | None) -> str:
    """A completion with candidate i holding programs[i - 1]; None leaves candidate i out."""
    return "reasoning\n" + "\n".join(
        format_full(i, code) for i, code in enumerate(programs, 1) if code is not None
    )


def outcomes(group: ParsedGroup) -> list[list[str]]:
    return [[c.outcome for c in rollout.candidates] for rollout in group.rollouts]


def completion(text: str) -> Completion:
    return Completion(text, (1, 2), (-0.5, -0.25), "stop", (7,))


# -- examples ----------------------------------------------------------------------------------


def test_new_duplicate_and_unparsed() -> None:
    texts = [
        answer("a = 1", "b = 2", None),
        answer("a = 1\n\n", "c = 3", "b = 2  "),  # layout noise: the same programs as before
    ]
    group = classify_group(texts, 3, PARENT, seen={code_hash("c = 3")})
    assert outcomes(group) == [["new", "new", "unparsed"], ["duplicate", "duplicate", "duplicate"]]
    first, second = group.rollouts
    assert first.status == "partial" and first.error == "3: no <candidate_3> in the completion"
    assert second.status == "ok" and second.error is None
    assert second.candidates[0].code_hash == first.candidates[0].code_hash
    assert group.new_code == {code_hash("a = 1"): "a = 1\n", code_hash("b = 2"): "b = 2\n"}


def test_nothing_parsed() -> None:
    group = classify_group(["", "no code here"], 2, PARENT, seen=set())
    assert [r.status for r in group.rollouts] == ["none", "none"]
    assert group.rollouts[0].error == "1: empty completion; 2: empty completion"
    assert group.new_code == {}


def test_a_nul_byte_is_unparsed() -> None:
    group = classify_group([answer("x = '\x00'", "y = 1")], 2, PARENT, seen=set())
    nul, fine = group.rollouts[0].candidates
    assert nul == Candidate(1, "unparsed", reason="the code contains a NUL byte")
    assert fine.outcome == "new"
    assert group.rollouts[0].error == "1: NUL byte" and group.rollouts[0].status == "partial"


def test_the_parse_error_is_bounded() -> None:
    group = classify_group(["x" * 10], 400, PARENT, seen=set())
    assert len(group.rollouts[0].error or "") == 500


def test_rollout_records_carry_the_evaluations() -> None:
    texts = [answer("a = 1", "a = 1"), answer(None, "z = 2")]
    group = classify_group(texts, 2, PARENT, seen=set())
    evaluations = {
        digest: Evaluation("ok", {"s": 0.5}, {"s": 1.5}, None, 0.25, {"k": {"stdout": ""}})
        for digest in group.new_code
    }
    records = rollout_records(group, [completion(t) for t in texts], evaluations)
    (a, a_again), (missing, z) = (r.candidates for r in records)
    assert a.outcome == "new" and a.program is not None and a.program.code == "a = 1\n"
    assert a.program.scores == {"s": 0.5} and a.program.eval_seconds == 0.25
    assert a.program.metrics == {"artifacts": {"k": {"stdout": ""}}}
    assert a_again.outcome == "duplicate" and a_again.program is None
    assert a_again.code_hash == a.code_hash
    assert missing.outcome == "unparsed" and missing.reason and missing.code_hash is None
    assert z.outcome == "new" and z.program is not None
    assert records[0].parse_status == "ok" and records[1].parse_status == "partial"
    assert records[0].token_ids == (1, 2) and records[0].logprobs == (-0.5, -0.25)


# -- properties --------------------------------------------------------------------------------

# A few short programs, so that duplicates (also up to layout noise) are common.
codes = st.sampled_from(["a = 1", "a = 1  \n\n", "b = 2", "c = 3", "d = '\x00'", "", "e = 5"])
programs = st.one_of(st.none(), codes)
texts = st.one_of(
    st.lists(programs, max_size=4).map(lambda p: answer(*p)),
    st.text(st.sampled_from("<>/candidate_12`\n x=")),
)
seen_hashes = st.sets(st.sampled_from(["a = 1", "c = 3", "zzz"]).map(code_hash))


@settings(max_examples=300, deadline=None)
@given(st.lists(texts, max_size=5), st.integers(1, 4), seen_hashes)
def test_each_candidate_gets_one_outcome(
    completions: list[str], candidates: int, seen: set[str]
) -> None:
    group = classify_group(completions, candidates, PARENT, seen)
    assert len(group.rollouts) == len(completions)
    hashes_before: set[str] = set(seen)
    for text, rollout in zip(completions, group.rollouts, strict=True):
        parsed = parse_completion(text, candidates, PARENT)
        assert [c.index for c in rollout.candidates] == list(range(1, candidates + 1))
        for candidate, reading in zip(rollout.candidates, parsed, strict=True):
            if reading.code is None or "\x00" in reading.code:
                assert candidate.outcome == "unparsed" and candidate.reason
                assert candidate.code is None and candidate.code_hash is None
                continue
            assert candidate.code == reading.code
            assert candidate.code_hash == code_hash(reading.code)
            assert candidate.reason is None
            # New exactly when no one evaluated that code before: never evaluated twice.
            expected = "duplicate" if candidate.code_hash in hashes_before else "new"
            assert candidate.outcome == expected
            hashes_before.add(candidate.code_hash)
        parsed_count = sum(c.outcome != "unparsed" for c in rollout.candidates)
        assert rollout.status == (
            "ok" if parsed_count == candidates else "partial" if parsed_count else "none"
        )
        assert (rollout.error is None) == (parsed_count == candidates)


@settings(max_examples=200, deadline=None)
@given(st.lists(texts, max_size=5), st.integers(0, 5), st.integers(1, 3), seen_hashes)
def test_one_group_classifies_as_its_parts_in_turn(
    completions: list[str], cut: int, candidates: int, seen: set[str]
) -> None:
    """A group split in two, the second half seeing what the first made new, gives the same
    outcomes: a candidate's fate depends only on the code evaluated before it."""
    whole = classify_group(completions, candidates, PARENT, seen)
    first = classify_group(completions[:cut], candidates, PARENT, seen)
    second = classify_group(completions[cut:], candidates, PARENT, seen | set(first.new_code))
    # Laziness is the one part that depends on where the group starts (a repeat of a program
    # stored before the group); the outcomes do not.
    assert unlazy(whole.rollouts) == unlazy(first.rollouts + second.rollouts)
    assert whole.new_code == {**first.new_code, **second.new_code}


def unlazy(rollouts: tuple[Any, ...]) -> list[Any]:
    return [
        replace(r, candidates=tuple(replace(c, lazy=False) for c in r.candidates)) for r in rollouts
    ]


def test_lazy_candidates_repeat_the_parent_or_what_was_stored_before() -> None:
    stored = "x = 2\n"
    texts = [f"<candidate_1>\n```python\n{code}```\n</candidate_1>" for code in
             (PARENT, stored, "y = 3\n", "y = 3\n")]  # fmt: skip
    group = classify_group(texts, 1, PARENT, {code_hash(stored)})
    found = [(c.outcome, c.lazy) for r in group.rollouts for c in r.candidates]
    assert found == [("duplicate", True), ("duplicate", True), ("new", False), ("duplicate", False)]


@settings(max_examples=200, deadline=None)
@given(st.lists(texts, max_size=5), st.integers(1, 3), seen_hashes)
def test_what_is_new_is_evaluated_once(
    completions: list[str], candidates: int, seen: set[str]
) -> None:
    group = classify_group(completions, candidates, PARENT, seen)
    new = group.new_code
    news = [c for r in group.rollouts for c in r.candidates if c.outcome == "new"]
    assert len(new) == len(news) and not set(new) & seen
    assert all(code_hash(code) == digest for digest, code in new.items())
    # Classifying again once they are evaluated: nothing is new any more.
    again = classify_group(completions, candidates, PARENT, seen | set(new))
    assert again.new_code == {}
    records = rollout_records(
        group,
        [completion(t) for t in completions],
        {digest: Evaluation("ok", {"s": 1.0}, {"s": None}) for digest in new},
    )
    stored = [c for r in records for c in r.candidates if c.program is not None]
    assert sorted(c.code_hash for c in stored) == sorted(new)


# -- the parent again, under a new docstring or beside unused code ------------------------------

SEED = '''import numpy as np


def equation(x, v, params):
    """Linear."""
    return params[0] * x + params[1] * v + params[2]
'''


def test_entry_key_sees_through_docstrings_comments_and_unused_helpers() -> None:
    key = entry_key(SEED, "equation")
    assert key is not None
    reworded = SEED.replace('"""Linear."""', '"""A fresh docstring."""  # and a comment')
    beside = SEED + "\n\ndef new_equation(x, v, params):\n    return params[0] * x**2\n"
    assert entry_key(reworded, "equation") == key
    assert entry_key(beside, "equation") == key
    no_docstring = SEED.replace('    """Linear."""\n', "")
    assert entry_key(no_docstring, "equation") == key


def test_entry_key_keeps_what_can_change_the_result() -> None:
    key = entry_key(SEED, "equation")
    changed = SEED.replace("params[2]", "params[2] * x * v")
    helper = (
        SEED.replace("return params[0]", "return extra(x) + params[0]")
        + "\n\ndef extra(x):\n    return x**3\n"
    )
    other_helper = helper.replace("x**3", "x**2")
    top_level = SEED + "\nnp.seterr(all='raise')\n"
    keys = [entry_key(code, "equation") for code in (changed, helper, other_helper, top_level)]
    assert key not in keys and len(set(keys)) == 4
    # A helper reached only from module-level code is kept too.
    called = SEED + "\n\ndef setup():\n    return 1\n\n\nK = setup()\n"
    assert entry_key(called, "equation") != entry_key(called.replace("return 1", "return 2"),
                                                      "equation")  # fmt: skip


def test_entry_key_is_none_where_it_cannot_judge() -> None:
    assert entry_key("def equation(:\n", "equation") is None  # a syntax error
    assert entry_key("def f():\n    return 1\n", "equation") is None  # no entry
    twice = SEED + "\n\ndef equation(x, v, params):\n    return x\n"
    assert entry_key(twice, "equation") is None  # which one runs is an execution question


def test_the_parent_under_a_new_docstring_is_a_lazy_duplicate_of_the_parent() -> None:
    reworded = SEED.replace('"""Linear."""', '"""Starting equation, rewritten."""')
    beside = SEED + "\n\ndef new_equation(x, v, params):\n    return params[0] * x**2\n"
    new = SEED.replace("params[2]", "params[2] * x * v")
    texts = [answer(reworded, beside, new)]
    group = classify_group(texts, 3, SEED, seen=set(), entry="equation")
    first, second, third = group.rollouts[0].candidates
    for copy in (first, second):
        assert (copy.outcome, copy.lazy, copy.code_hash) == ("duplicate", True, code_hash(SEED))
        assert copy.reason is not None and "`equation`" in copy.reason
    assert (third.outcome, third.lazy) == ("new", False)
    assert group.new_code == {code_hash(new): new}
    # Without an entry, only the code hash judges: all three are new programs.
    assert outcomes(classify_group(texts, 3, SEED, seen=set())) == [["new", "new", "new"]]


# -- equation families: a candidate that only rewrites its parent's constants -------------------


def test_a_candidate_padding_its_parent_with_constants_is_a_lazy_duplicate() -> None:
    """What the VPO grid's policy learned (benchmarks/results/discovery.md): new code, so not a
    duplicate by hash, scoring what the parent did. Its family gives it away before the
    sandbox, and a family stored before is lazy too; one a candidate brought earlier in the
    batch is a plain duplicate of it."""
    from problems.registry import load

    problem = load("equation_discovery:oscillator1")
    compact = problem.compact
    assert compact is not None
    parent = compact.program("params[0] * x + params[1] * v + params[2]")
    padded = "params[0] * x + params[1] * v + params[2] + params[8] + params[9] - params[9]"
    new = "params[0] * x + params[1] * v + params[2] + params[3] * x ** 3"
    renamed = "params[4] * x ** 3 + params[2] + v * params[1] + params[0] * x"
    stored = "params[0] * np.sin(x) + params[1]"
    memory = Novelty(problem.entry, problem.family)
    memory.families[problem.family(compact.program(stored)) or ""] = "f" * 64
    batch = BatchKeys()
    texts = [f"<candidate_1>\n{a}\n</candidate_1>\n<candidate_2>\n{b}\n</candidate_2>" for a, b in (
        (padded, new), (renamed, "params[5] * np.sin(x) - params[3]")
    )]  # fmt: skip
    group = classify_group(
        texts, 2, parent, set(), problem.entry, compact.program,
        family=problem.family, memory=memory, batch=batch,
    )  # fmt: skip
    (lazy, first), (again, old) = (r.candidates for r in group.rollouts)
    assert (lazy.outcome, lazy.lazy, lazy.code_hash) == ("duplicate", True, code_hash(parent))
    assert lazy.reason and "the same family as program" in lazy.reason
    assert (first.outcome, first.lazy) == ("new", False) and first.family is not None
    assert (again.outcome, again.lazy, again.code_hash) == ("duplicate", False, first.code_hash)
    assert (old.outcome, old.lazy, old.code_hash) == ("duplicate", True, "f" * 64)
    assert batch.families == {first.family: first.code_hash}
    assert list(group.new_code) == [first.code_hash]  # one evaluation for the four


def test_without_a_family_every_new_text_is_new() -> None:
    group = classify_group([answer("a = 1", "a = 1 + 0")], 2, PARENT, set(), family=lambda _: None)
    assert outcomes(group) == [["new", "new"]]
