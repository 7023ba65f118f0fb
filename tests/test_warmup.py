"""The format warm-up: imitation of the model's own well-formed answers, end to end on a tiny
model taught the format first, and its one-line refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.config.settings import build
from harness.evolution.warmup import WarmupSettings, _first_prompt, warm_up, well_formed
from harness.llm.base import Completion, chat_prompt_ids
from problems.circle_packing import CirclePacking
from trainer.imitation import imitation_step
from trainer.logprobs import token_batch, token_logprobs
from trainer.policy import Policy, PolicyConfig
from trainer.train import Rollout

PROGRAM = "def f():\n    return 1\n"
ANSWER = "".join(f"<candidate_{i}>\n```python\n{PROGRAM}```\n</candidate_{i}>\n" for i in (1, 2))


def completion(text: str) -> Completion:
    return Completion(text, (), None, "stop", None)


def test_an_answer_is_well_formed_when_every_candidate_parsed() -> None:
    assert well_formed(completion(ANSWER), 2, PROGRAM)
    assert not well_formed(completion(ANSWER), 3, PROGRAM)  # the third is missing
    # Cut inside the last program: its code block never closed.
    assert not well_formed(completion(ANSWER[: ANSWER.rindex("```")]), 2, PROGRAM)
    # Without the last closing tag but with its code block closed, the program is whole.
    assert well_formed(completion(ANSWER.replace("</candidate_2>", "")), 2, PROGRAM)
    # One candidate asked for: an untagged code block is taken for it, as a campaign does.
    assert well_formed(completion(f"```python\n{PROGRAM}```"), 1, PROGRAM)
    assert not well_formed(completion("no code at all"), 1, PROGRAM)


def nll(policy: Policy, rollouts: list[Rollout]) -> float:
    rows = [(list(r.prompt_ids), list(r.completion_ids), None) for r in rollouts]
    batch = token_batch(rows, device=policy.device)
    with torch.no_grad():
        values, _ = token_logprobs(policy.model, batch, 1.0, 1.0)
    return float(-(values * batch["completion_mask"]).sum() / batch["completion_mask"].sum())


def test_an_imitation_step_raises_the_likelihood_of_the_answers(tiny_model: str) -> None:
    policy = Policy.load(tiny_model, PolicyConfig(lr=1e-2, reference=False))
    prompt = chat_prompt_ids(policy.tokenizer, [{"role": "user", "content": "answer"}])
    answer = policy.tokenizer(ANSWER)["input_ids"]
    rollouts = [Rollout(prompt, answer)]
    before = nll(policy, rollouts)
    metrics = imitation_step(policy, rollouts)
    assert metrics.nll == pytest.approx(before, rel=1e-3)
    assert metrics.tokens == len(answer) and metrics.step == policy.step == 1
    assert nll(policy, rollouts) < before
    with pytest.raises(ValueError, match="at least one"):
        imitation_step(policy, [])


@pytest.fixture(scope="module")
def taught_model(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny random model after imitating one well-formed answer to the warm-up's prompt: it
    now writes the format, as a small instruct model does some of the time. (At lr 1.5e-2 and
    120 steps it memorised the answer only partly once the prompt grew by a sentence, and 200
    steps at that rate diverged: 5e-3 for 200 steps reaches an NLL near 1e-3.)"""
    config = build({"problem": "circle_packing", "model": tiny_model, "candidates": 2})
    prompt, _ = _first_prompt(config, CirclePacking())
    policy = Policy.load(tiny_model, PolicyConfig(lr=5e-3, reference=False))
    prompt_ids = chat_prompt_ids(policy.tokenizer, prompt)
    end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    answer = [*policy.tokenizer(ANSWER)["input_ids"], end]
    for _ in range(200):
        imitation_step(policy, [Rollout(prompt_ids, answer)])
    return str(policy.save_merged(tmp_path_factory.mktemp("taught")))


def test_a_warm_up_keeps_the_well_formed_answers_and_learns_from_them(
    taught_model: str, tmp_path: Path
) -> None:
    config = build(
        {
            "problem": "circle_packing",
            "model": taught_model,
            "backend": "transformers",
            "candidates": 2,
            "max_tokens": 64,
            "temperature": 0.3,
        }
    )
    settings = WarmupSettings(samples=12, epochs=2, answers_per_step=4, measure=8)
    out = tmp_path / "warm"
    report = warm_up(config, CirclePacking(), settings, out, say=lambda line: None)
    assert 0 < report["kept"] <= 12 and report["parse_rate_before"] == report["kept"] / 12
    assert 0.0 <= report["parse_rate_after"] <= 1.0 and report["measured"] == 8
    steps = report["steps"]
    assert len(steps) == 2 * -(-report["kept"] // 4)
    assert json.loads((out / "vpo-warmup.json").read_text())["kept"] == report["kept"]
    # The written model is a plain folder a campaign can start from.
    Policy.load(str(out), PolicyConfig(reference=False))


def test_a_model_with_no_well_formed_answer_is_a_one_line_error(
    tiny_model: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "warmup",
            "circle_packing",
            "--model",
            tiny_model,
            "--backend",
            "transformers",
            "--samples",
            "3",
            "--max-tokens",
            "16",
            "--out",
            str(tmp_path / "warm"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 2, result.stderr  # a user error
    lines = result.stderr.strip().splitlines()
    assert "none of 3 answers had all 3 candidates" in lines[-1]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "warm").exists() or not any((tmp_path / "warm").iterdir())
