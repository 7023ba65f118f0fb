"""What one training pass's saved activations cost in memory, and whether to recompute them.

Activation checkpointing trades 23-25% more time a step (benchmarks/results/
train_memory_sharded.md) for not keeping each decoder layer's activations until the backward
pass. Whether that is needed depends on the pass as much as on the model: the 0.5B coder's
passes of four 1,400-token rollouts kept ~8 GB, and beside `vllm serve` on 24 GB the kernel
killed the run without a word (benchmarks/peers.py, oscillator1 seed 0), while the demo's
passes of 200-token answers keep under 1 GB.

So "auto" measures. `ActivationCost.measure` runs the model forward on one dummy row at three
lengths and counts the bytes of what autograd saves for the backward pass (the parameters
themselves left out), and fits bytes = fixed + a * width + b * width^2 (the fixed part: the
weights' bf16 copies under autocast; the square: an attention that keeps its L x L
probabilities). The probe's logits are computed in small checkpointed chunks, so the fit is
the decoder's; a pass's logits are added apart, as the peak of one chunk of them
(trainer/logprobs.py computes them `logit_chunk` positions at a time): LOGIT_BYTES a position
and vocabulary entry. A pass is checkpointed when its estimate is more than `SHARE` of the
memory free before it.

The logits have a knob of their own. A chunk of 2,048 positions of Qwen2.5's 152k vocabulary
peaks at 3.5 GiB, whatever the decoder keeps, so "auto" also shortens the chunk (never below
LOGIT_CHUNK_FLOOR) until its peak is at most LOGIT_SHARE of the memory free: no cost while
memory is ample, and where it is short each chunk is recomputed in the backward pass (a second
run of the vocabulary projection) instead of the process being killed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from trainer.logprobs import pack_batch, token_batch, token_logprobs


class Policy(Protocol):
    """What the decision reads from trainer.policy.Policy (named, not imported: the policy
    module imports this one)."""

    device: torch.device
    model: Any
    scorer: Any
    tokenizer: Any
    activation_cost: dict[bool, ActivationCost]
    recomputed_memory: tuple[float, int] | None
    shortened_logit_chunk: tuple[int, int] | None
    auto_checkpointing: bool
    memory_free: Callable[[torch.device], int | None]

    def autocast(self) -> contextlib.AbstractContextManager[Any]: ...


# A pass recomputes its activations when keeping them would take more than this share of the
# free memory: the backward pass needs room beside them (the logits of a chunk, the gradients
# of the activations, the optimiser's temporaries).
SHARE = 0.5
# The dummy row's lengths the cost is fitted on: short enough to cost a fraction of a second
# on a CPU, far enough apart to tell a linear cost from a square one, and long enough to take
# the path real passes take (a packed row of 32 kept 14x what one of 64 did on the test model).
PROBE_WIDTHS = (64, 128, 256)
# The probe's logit chunk: small, so that its logits are recomputed rather than kept.
PROBE_CHUNK = 16
# A chunk of logits at its peak, forward and backward (the head's bf16 output, the fp32 logits,
# their log-softmax, the gradients): 12.0-12.4 bytes a position and vocabulary entry, measured
# on Qwen2.5's 896 x 151,936 head at 256-2,048 positions, top_p 1 and 0.95 alike.
LOGIT_BYTES = 12.5
# "auto" shortens the logit chunk until a chunk's peak is at most this share of the memory free
# (the decoder's activations have SHARE beside it), to no fewer positions than the floor.
LOGIT_SHARE = 0.25
LOGIT_CHUNK_FLOOR = 64


@dataclass(frozen=True)
class ActivationCost:
    """Bytes a pass keeps for its backward pass: its decoder's, fixed + rows * (linear * w +
    square * w^2) for `rows` rows of width `w`, and its logits'."""

    fixed: float
    linear: float
    square: float
    logit_position: float = 0.0  # a chunk's peak bytes a position: LOGIT_BYTES x vocabulary

    def bytes(self, rows: int, width: int, positions: int, logit_chunk: int) -> float:
        """The estimate for a pass of `rows` rows of `width` tokens predicting `positions`
        completion tokens with logits computed `logit_chunk` positions at a time."""
        decoder = self.fixed + rows * (self.linear * width + self.square * width * width)
        return decoder + min(positions, logit_chunk) * self.logit_position

    @classmethod
    def measure(
        cls,
        forward: Callable[[int], Any],
        parameters: Iterator[torch.Tensor],
        vocabulary: int,
    ) -> ActivationCost:
        """The cost fitted on `forward(width)` (a pass of one row of that width, with grad and
        logits in PROBE_CHUNK chunks) at PROBE_WIDTHS; the storage of `parameters` is not
        counted."""
        own = {p.untyped_storage().data_ptr() for p in parameters}
        widths = np.array(PROBE_WIDTHS, dtype=float)
        kept = np.array([saved_bytes(lambda w=int(w): forward(w), own) for w in widths])
        fixed, linear, square = np.linalg.solve(
            np.stack([np.ones_like(widths), widths, widths**2], axis=1), kept
        )
        return cls(
            max(float(fixed), 0.0),
            max(float(linear), 0.0),
            max(float(square), 0.0),
            LOGIT_BYTES * vocabulary,
        )


def pass_needs_recompute(policy: Policy, batch: dict[str, torch.Tensor], logit_chunk: int) -> bool:
    """Whether `policy`'s pass over `batch` would keep more than SHARE of the memory free
    (False where that cannot be read); the cost of a pass of its kind (packed rows or a row a
    rollout) is measured at the first one."""
    free = policy.memory_free(policy.device)
    if free is None:
        return False
    packed = "segments" in batch
    if packed not in policy.activation_cost:
        policy.activation_cost[packed] = measure_policy(policy, packed)
    rows, width = batch["input_ids"].shape
    positions = batch["completion_ids"].numel()
    estimate = policy.activation_cost[packed].bytes(rows, width, positions, logit_chunk)
    if estimate <= SHARE * free:
        return False
    policy.recomputed_memory = (estimate, free)
    return True


def fit_logit_chunk(policy: Policy, logit_chunk: int, positions: int) -> int:
    """The positions a chunk of the logits of `policy`'s pass predicting `positions` tokens
    takes: `logit_chunk`, or under "auto" (`policy.auto_checkpointing`) fewer, LOGIT_CHUNK_FLOOR
    at least, where a chunk would peak at more than LOGIT_SHARE of the memory free; as given
    where that cannot be read. A chunk that splits the pass is kept for the log."""
    free = policy.memory_free(policy.device) if policy.auto_checkpointing else None
    if free is None:
        return logit_chunk
    vocabulary = policy.model.get_output_embeddings().weight.shape[0]
    fits = int(LOGIT_SHARE * free // (LOGIT_BYTES * vocabulary))
    chunk = min(logit_chunk, max(LOGIT_CHUNK_FLOOR, fits))
    if chunk < min(logit_chunk, positions):  # a pass it splits, not one shorter anyway
        policy.shortened_logit_chunk = (chunk, logit_chunk)
    return chunk


def measure_policy(policy: Policy, packed: bool) -> ActivationCost:
    """What `policy`'s training passes keep for the backward pass: of rows of one rollout
    each, or of packed rows (one prompt, several completions), whose attention may keep more."""
    token = policy.tokenizer.eos_token_id or 0

    def forward(width: int) -> None:
        if packed:  # a prompt of half the width and two completions of a quarter
            pack = ([token] * (width // 2), [[token] * (width // 4)] * 2, [None, None])
            batch = pack_batch([pack], token, policy.device)
        else:
            batch = token_batch([([token], [token] * (width - 1), None)], token, policy.device)
        with torch.enable_grad(), policy.autocast():
            token_logprobs(policy.scorer, batch, 1.0, 1.0, PROBE_CHUNK)

    vocabulary = policy.model.get_output_embeddings().weight.shape[0]
    return ActivationCost.measure(forward, policy.model.parameters(), vocabulary)


def saved_bytes(run: Callable[[], Any], skip: set[int] = frozenset()) -> int:
    """The bytes of the distinct storages autograd saves for the backward pass while `run()`
    runs, those in `skip` left out. The tensors are held in a list of their own until it
    returns, so that no storage is freed and reused meanwhile (which would count two tensors
    as one), and the graph holds none: it cannot be run backward (a hook that handed each
    tensor back to the graph would tie a saved output to the node that made it, a cycle
    nothing frees: 0.4 GB a probe of the 135M model)."""
    kept: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> None:
        kept.append(tensor)

    def unpack(_: None) -> torch.Tensor:
        raise RuntimeError("a graph measured by saved_bytes cannot be run backward")

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        run()
    sizes: dict[int, int] = {}
    for tensor in kept:
        with contextlib.suppress(RuntimeError):  # a tensor without storage (a meta tensor)
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in skip:
                sizes[storage.data_ptr()] = storage.nbytes()
    kept.clear()
    return sum(sizes.values())


def free_memory(device: torch.device) -> int | None:
    """Bytes this process can still allocate on `device`: free plus the allocator's cached but
    unused blocks on a GPU; on a CPU the system's available memory, or what is left under the
    process's cgroup limit where that is less. None where it cannot be told."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + cached)
    if device.type != "cpu":
        return None
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    available = next(
        (
            int(line.split()[1]) * 1024
            for line in meminfo.splitlines()
            if line.startswith("MemAvailable:")
        ),
        None,
    )
    left = _cgroup_left()
    if available is None:
        return left
    return available if left is None else min(available, left)


def _cgroup_left() -> int | None:
    """The memory left under this process's cgroup limit (v2 or v1), None without one. The
    cgroup's usage counts the page cache; its inactive file pages, which the kernel drops
    before it kills, are counted as left."""
    for v1, limit_file, usage_file, inactive in (
        (False, "memory.max", "memory.current", "inactive_file"),
        (True, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
    ):
        folder = _cgroup_folder(v1)
        if folder is None:
            continue
        try:
            limit = (folder / limit_file).read_text().strip()
            usage = int((folder / usage_file).read_text())
            stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # no limit set
            return None
        return max(int(limit) - usage + int(stat.get(inactive, 0)), 0)
    return None


def _cgroup_folder(v1: bool) -> Path | None:
    """This process's memory cgroup folder under /sys/fs/cgroup (v1's memory controller or
    v2's unified tree)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if v1 and "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
        if not v1 and controllers == "":
            return Path("/sys/fs/cgroup") / path.lstrip("/")
    return None
