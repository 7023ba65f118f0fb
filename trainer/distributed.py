"""Several processes training one policy: the launcher's environment, the process group, and
the wrapper that owns the gradient reduction.

    parallel = Parallel.join("auto")        # one process: nothing joined, nothing wrapped
    policy = Policy.load(name, config, parallel=parallel)
    module = parallel.wrap(TokenLogprobs(model), mixed=torch.bfloat16)

`torchrun` and `accelerate launch` both start each process with RANK, WORLD_SIZE and
LOCAL_RANK set; the group is joined with NCCL on GPUs and gloo on CPUs. The sharding:

- "fsdp": torch's FSDP2 (`torch.distributed.fsdp.fully_shard`), one unit per decoder layer and
  one for the rest (embeddings, final norm, vocabulary projection), parameters as DTensors,
  each process holding 1/world of every weight, gradient and optimiser moment. Mixed precision
  computes in bf16 where the hardware has it and keeps fp32 master weights.
- "ddp": whole copies, gradients all-reduced (DistributedDataParallel); for models small enough
  that sharding only costs communication.
- "none": one process, the model as it is.

"auto" is fsdp on several processes (and when accelerate's config asks for FSDP), none on one.
A world of one can still be given "fsdp": a real FSDP wrap, for checking it on one GPU.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

SHARDINGS = ("auto", "fsdp", "ddp", "none")
# How long a process waits for the others at a collective (the main process may be saving a
# checkpoint or a follower polling its database meanwhile).
TIMEOUT = datetime.timedelta(minutes=60)


class ParallelError(ValueError):
    """A launch this trainer cannot run (said in one line)."""


@dataclass(frozen=True)
class Parallel:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    sharding: str = "none"  # resolved: "fsdp", "ddp" or "none"

    @classmethod
    def join(cls, sharding: str = "auto") -> Parallel:
        """This process's place among the launcher's, the process group joined when there are
        several (or when FSDP is asked for on one)."""
        if sharding not in SHARDINGS:
            raise ParallelError(f"sharding must be one of {', '.join(SHARDINGS)}, got {sharding!r}")
        if _flag("ACCELERATE_USE_DEEPSPEED"):
            raise ParallelError(
                "accelerate's config asks for DeepSpeed, which vpo train does not run; use FSDP "
                "(`accelerate launch --use_fsdp ...` or `--sharding fsdp` under torchrun)"
            )
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if sharding == "auto":
            sharding = "fsdp" if world > 1 or _flag("ACCELERATE_USE_FSDP") else "none"
        if sharding == "ddp" and world == 1:
            sharding = "none"
        # `accelerate launch --use_fsdp` asks transformers (FSDP_CPU_RAM_EFFICIENT_LOADING) to
        # load the weights on one process only and leave the others empty, for FSDP1 to
        # broadcast; fully_shard keeps each process's own shard of its own copy, so every
        # process loads them.
        os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "false"
        parallel = cls(rank=rank, world=world, local_rank=local_rank, sharding=sharding)
        if sharding != "none":
            parallel._start_group()
        return parallel

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        """Whether collectives run (a process group is joined)."""
        return self.sharding != "none"

    @property
    def device(self) -> str:
        return f"cuda:{self.local_rank}" if torch.cuda.is_available() else "cpu"

    def _start_group(self) -> None:
        import torch.distributed as dist

        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
        if dist.is_initialized():
            return
        if self.world == 1:  # FSDP on one process: a group of one
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend, timeout=TIMEOUT)

    # -- collectives (identity on one process) ---------------------------------------------

    def sum(self, value: float) -> float:
        return self._reduce(value, "sum")

    def max(self, value: float) -> float:
        return self._reduce(value, "max")

    def _reduce(self, value: float, how: str) -> float:
        if not self.active:
            return value
        import torch.distributed as dist

        tensor = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        op = dist.ReduceOp.SUM if how == "sum" else dist.ReduceOp.MAX
        dist.all_reduce(tensor, op=op)
        return float(tensor.item())

    def broadcast(self, value: Any) -> Any:
        """The main process's `value` on every process (any picklable object)."""
        if not self.active:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        """Leave the process group (before the interpreter exits: gloo torn down at exit can
        crash the process)."""
        import torch.distributed as dist

        if self.active and dist.is_initialized():
            dist.destroy_process_group()

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as dist

            dist.barrier()

    @contextlib.contextmanager
    def gradient_sync(self, module: nn.Module, sync: bool) -> Iterator[None]:
        """Within it, `module`'s wrapper reduces the gradients of a backward pass only when
        `sync` (the last micro-batch of a step); before, they accumulate on each process."""
        if sync or self.sharding == "none":
            yield
        elif self.sharding == "ddp" and hasattr(module, "no_sync"):
            with module.no_sync():
                yield
        elif hasattr(module, "set_requires_gradient_sync"):
            module.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                module.set_requires_gradient_sync(True)
        else:
            yield

    # -- wrapping ------------------------------------------------------------------------------

    def wrap(self, module: nn.Module, layers: list[nn.Module], mixed: torch.dtype) -> nn.Module:
        """`module` under this process's sharding: FSDP2 units over `layers` then the rest, or
        DDP, or as it is. `mixed` is the compute dtype (bf16 where native; fp32 means none)."""
        if self.sharding == "none":
            return module
        if self.sharding == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            if not any(p.requires_grad for p in module.parameters()):
                return module  # a frozen reference: nothing to reduce
            ids = [self.local_rank] if torch.cuda.is_available() else None
            return DistributedDataParallel(module, device_ids=ids)
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        precision = MixedPrecisionPolicy(
            param_dtype=None if mixed == torch.float32 else mixed, reduce_dtype=torch.float32
        )
        for layer in layers:
            fully_shard(layer, mp_policy=precision)
        fully_shard(module, mp_policy=precision)
        return module


ALONE = Parallel()  # one process, nothing joined


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a transformers model (through a peft wrapper): the modules whose
    class the model names as never to be split across devices."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in base.modules() if type(m).__name__ in names]
    if not layers:
        raise ParallelError(
            f"{type(base).__name__} names no decoder layer class (_no_split_modules), so it "
            "cannot be sharded layer by layer; use --sharding ddp"
        )
    return layers


def _flag(variable: str) -> bool:
    return os.environ.get(variable, "false").lower() in ("true", "1")  # as accelerate reads them


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
