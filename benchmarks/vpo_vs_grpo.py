"""Does VPO keep a policy diverse where GRPO collapses? A toy task with conflicting objectives.

    python benchmarks/vpo_vs_grpo.py [--steps 150] [--seeds 3]

Task. The prompt is fixed. A candidate is L = 6 letters from {a, b, c}; its reward vector is
(x^2, y^2) where x and y are the shares of a and b. Both corners (all a, all b) maximise the mean
of the objectives, no candidate is good at both, and any mix is worse than a corner under every
weighting: the objectives conflict. A rollout holds its candidates one after the other (one for
GRPO, two for VPO, as the VPO paper compares single-answer GRPO with multi-answer VPO).

Policy. A randomly initialised 2-layer Llama (hidden 64) over a 7-token vocabulary, trained from
scratch by `trainer.train.train_step` (the code `vpo run --train-every` runs) with AdamW, lr
3e-3, no KL term (the reference would be the random initialisation), B = 8 prompts x G = 8
rollouts per step, the same number of steps and seeds for both. Letters are sampled at
temperature 1 from the policy restricted to {a, b, c}.

Measured: per step, pool diversity (mean pairwise L1 distance between the reward vectors of a
group's candidates, as `vpo run` reports it) and mean reward; after training, best@k for k = 1..8
candidates at an equal evaluation budget (k candidates: k GRPO rollouts or ceil(k / 2) VPO
rollouts), under (1) the mean of the objectives, GRPO's training scalar, and (2) 200 held-out
trade-offs w ~ Dirichlet(1), averaged over 400 draws of the k candidates.

Prints a table, writes it to benchmarks/results/vpo_vs_grpo.md and the plot to
benchmarks/results/vpo_vs_grpo.png. Whatever it shows is what is reported.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.loss import LossConfig  # noqa: E402
from trainer.policy import Policy, PolicyConfig  # noqa: E402
from trainer.train import Group, Rollout, TrainConfig, train_step  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
VOCAB = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "a": 3, "b": 4, "c": 5, "|": 6}
LETTERS = torch.tensor([VOCAB["a"], VOCAB["b"], VOCAB["c"]])
LENGTH = 6
PROMPTS, GROUP = 8, 8
METHODS = {"GRPO (m = 1)": ("grpo", 1), "VPO (m = 2)": ("vpo", 2)}
KS = range(1, 9)


def tiny_policy_folder(seed: int) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    from trainer.models import tiny_llama_config

    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )
    torch.manual_seed(seed)
    config = tiny_llama_config(
        len(VOCAB),
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    folder = tempfile.mkdtemp(prefix="vpo-toy-")
    LlamaForCausalLM(config).save_pretrained(folder)
    wrapped.save_pretrained(folder)
    return folder


@torch.no_grad()
def sample(policy: Policy, rows: int, candidates: int, generator: torch.Generator) -> torch.Tensor:
    """(rows, candidates * L) letter token ids, drawn from the policy restricted to the letters."""
    model = policy.model
    model.eval()
    ids = torch.full((rows, 1), VOCAB["<bos>"])
    for _ in range(candidates * LENGTH):
        logits = model(ids).logits[:, -1, LETTERS]
        pick = torch.multinomial(logits.softmax(-1), 1, generator=generator)
        ids = torch.cat([ids, LETTERS[pick]], dim=1)
    model.train()
    return ids[:, 1:]


def rewards(tokens: torch.Tensor, candidates: int) -> np.ndarray:
    """(rows, candidates, 2) reward vectors: (share of a, share of b), squared."""
    letters = tokens.reshape(tokens.shape[0], candidates, LENGTH)
    x = (letters == VOCAB["a"]).float().mean(-1)
    y = (letters == VOCAB["b"]).float().mean(-1)
    return torch.stack([x**2, y**2], dim=-1).numpy().astype(np.float64)


def train(
    method: str, candidates: int, steps: int, seed: int
) -> tuple[Policy, list[dict[str, float]]]:
    policy = Policy.load(tiny_policy_folder(seed), PolicyConfig(lr=3e-3, reference=False))
    config = TrainConfig(advantage=method, loss=LossConfig(beta=0.0), micro_batch=64)
    generator = torch.Generator().manual_seed(seed)
    history = []
    for step in range(steps):
        tokens = sample(policy, PROMPTS * GROUP, candidates, generator)
        scores = rewards(tokens, candidates)
        groups = [
            Group(
                rollouts=[
                    Rollout([VOCAB["<bos>"]], tokens[i].tolist())
                    for i in range(p * GROUP, (p + 1) * GROUP)
                ],
                scores=scores[p * GROUP : (p + 1) * GROUP],
                mask=np.ones((GROUP, candidates), dtype=bool),
            )
            for p in range(PROMPTS)
        ]
        metrics = train_step(
            policy, groups, config, generator=torch.Generator().manual_seed(seed * 10_000 + step)
        )
        history.append(
            {
                "step": step + 1,
                "diversity": metrics.diversity,
                "reward": float(scores.mean(-1).mean()),
            }
        )
    return policy, history


def best_at_k(policy: Policy, candidates: int, seed: int) -> tuple[list[float], list[float]]:
    generator = torch.Generator().manual_seed(seed + 99)
    pool = rewards(sample(policy, 400, candidates, generator), candidates)  # (400, candidates, 2)
    rng = np.random.default_rng(seed)
    tradeoffs = rng.dirichlet(np.ones(2), size=200)  # (200, 2)
    scalar, spread = [], []
    for k in KS:
        by_mean, by_tradeoff = [], []
        for _ in range(400):
            chosen = rng.choice(len(pool), size=math.ceil(k / candidates), replace=False)
            first_k = pool[chosen].reshape(-1, 2)[:k]  # the first k candidates
            by_mean.append(first_k.mean(-1).max())
            by_tradeoff.append((first_k @ tradeoffs.T).max(axis=0).mean())
        scalar.append(float(np.mean(by_mean)))
        spread.append(float(np.mean(by_tradeoff)))
    return scalar, spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict[str, dict[str, list]] = {}
    started = time.perf_counter()
    for name, (method, candidates) in METHODS.items():
        runs = {"diversity": [], "reward": [], "scalar": [], "tradeoff": []}
        for seed in range(args.seeds):
            policy, history = train(method, candidates, args.steps, seed)
            runs["diversity"].append([h["diversity"] for h in history])
            runs["reward"].append([h["reward"] for h in history])
            scalar, tradeoff = best_at_k(policy, candidates, seed)
            runs["scalar"].append(scalar)
            runs["tradeoff"].append(tradeoff)
            print(
                f"{name} seed {seed}: diversity {history[0]['diversity']:.3f} -> "
                f"{np.mean(runs['diversity'][-1][-10:]):.3f}, best@8 under trade-offs "
                f"{tradeoff[-1]:.3f}",
                flush=True,
            )
        results[name] = {key: np.mean(value, axis=0).tolist() for key, value in runs.items()}
    seconds = time.perf_counter() - started
    write(args, results, seconds)


def write(args: argparse.Namespace, results: dict[str, dict[str, list]], seconds: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for name, run in results.items():
        steps = range(1, len(run["diversity"]) + 1)
        axes[0].plot(steps, run["diversity"], label=name)
        axes[1].plot(list(KS), run["scalar"], marker="o", label=name)
        axes[2].plot(list(KS), run["tradeoff"], marker="o", label=name)
    axes[0].set(xlabel="training step", ylabel="pool diversity (mean L1)", title="Diversity")
    axes[1].set(xlabel="k candidates", ylabel="best@k", title="best@k, mean of objectives")
    axes[2].set(xlabel="k candidates", ylabel="best@k", title="best@k, held-out trade-offs")
    for axis in axes:
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(f"VPO vs GRPO on conflicting objectives ({args.seeds} seeds each)")
    figure.tight_layout()
    figure.savefig(RESULTS / "vpo_vs_grpo.png", dpi=110)

    def last(values: list[float]) -> float:
        return float(np.mean(values[-10:]))

    lines = [
        "# VPO against GRPO on a task with conflicting objectives",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {platform.machine()}, torch {torch.__version__}",
        f"- command: `python benchmarks/vpo_vs_grpo.py --steps {args.steps} --seeds "
        f"{args.seeds}` ({seconds:.0f} s)",
        "- task, policy and measures: see the docstring of benchmarks/vpo_vs_grpo.py; means "
        "over seeds; plot: benchmarks/results/vpo_vs_grpo.png",
        "",
        "| method | diversity, first step | diversity, last 10 steps | mean reward, last 10 "
        "| "
        + " | ".join(f"best@{k} mean" for k in (1, 2, 4, 8))
        + " | "
        + " | ".join(f"best@{k} trade-offs" for k in (1, 2, 4, 8))
        + " |",
        "|---|" + "---:|" * 11,
    ]
    for name, run in results.items():
        cells = [
            f"{run['diversity'][0]:.3f}",
            f"{last(run['diversity']):.3f}",
            f"{last(run['reward']):.3f}",
            *(f"{run['scalar'][k - 1]:.3f}" for k in (1, 2, 4, 8)),
            *(f"{run['tradeoff'][k - 1]:.3f}" for k in (1, 2, 4, 8)),
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    report = "\n".join(lines) + "\n"
    print(report)
    (RESULTS / "vpo_vs_grpo.md").write_text(report)
    print(f"written to {RESULTS / 'vpo_vs_grpo.md'} and vpo_vs_grpo.png")


if __name__ == "__main__":
    main()
