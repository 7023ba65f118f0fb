"""A trainable policy: the model, its frozen reference, the optimiser, and versioned checkpoints.

    policy = Policy.load("smollm2", PolicyConfig(lora=True))
    ... train steps ...
    policy.save("runs/circles.policies/step-000003")      # weights or adapter + optimiser state
    policy = Policy.resume("runs/circles.policies/step-000003")

Full fine-tuning keeps fp32 master weights and, where the hardware multiplies bf16 natively,
runs the forward pass under bf16 autocast; the reference is a frozen copy of the initial
weights. With LoRA (`peft`) only the adapter trains and the reference is the base model with
the adapter switched off, so no second copy is kept.

A checkpoint folder holds what `from_pretrained` reads (full weights as safetensors, or the
adapter), the tokenizer, `optimizer.pt` and `policy.json` (step, base model, LoRA settings).
It is written to a temporary folder and renamed into place: a kill never leaves half of one.

Under several processes (trainer/distributed.py) the policy is wrapped where it is built: the
optimiser then holds each process's shard. A sharded version is saved with
`torch.distributed.checkpoint` into `sharded/` (every process writes its own shards of the
weights and optimiser moments; nothing is gathered), beside the consolidated Hugging Face
weights (gathered to the main process's memory and written by it) that vLLM and `--model` load.
`resume` restores the optimiser from `sharded/` whatever the number of processes now.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.activations import ActivationCost, free_memory, pass_needs_recompute
from trainer.adapters import frozen_copy, frozen_linear_to, recompute, with_lora
from trainer.distributed import ALONE, Parallel, decoder_layers
from trainer.logprobs import TokenLogprobs
from trainer.models import ModelError, load_model, load_tokenizer, preferred_dtype

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

STATE_FILE = "policy.json"
OPTIMIZER_FILE = "optimizer.pt"
SHARDED_FOLDER = "sharded"  # torch.distributed.checkpoint: weights and optimiser, by shard
GRADIENT_CHECKPOINTING = ("auto", "on", "off")
PRECISIONS = ("auto", "float32")
# "auto" turns activation checkpointing on from this many parameters: below it weights and
# optimiser state leave a GPU room for the activations, and recomputing them costs 23-25% more
# time per step (measured on a 276M Llama: benchmarks/results/train_memory_sharded.md; the
# arithmetic for 8B models in docs/training.md). Below it, one process turns it on for each pass
# whose activations would not fit (trainer/activations.py).
CHECKPOINTING_FROM = 1_000_000_000


@dataclass(frozen=True)
class PolicyConfig:
    lr: float = 1e-6  # the VPO paper's full fine-tuning rate; LoRA usually wants ~1e-5..1e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    lora: bool = False
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    # The adapter on the top N decoder layers only (0: every layer). The backward pass then
    # stops at the lowest adapted layer: the layers below it run forward only, once.
    lora_layers: int = 0
    reference: bool = True  # keep a frozen reference for the KL term
    # Recompute each decoder layer's activations in the backward pass instead of keeping them:
    # "auto" from CHECKPOINTING_FROM parameters, and below that (one process) for each pass
    # whose activations would take more than half the memory free (trainer/activations.py).
    gradient_checkpointing: str = "auto"
    device: str | None = None
    # What the passes compute in: "auto" is `preferred_dtype` (bf16 autocast where the hardware
    # runs it natively), "float32" no autocast (as an fp32 sampler computes).
    precision: str = "auto"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.lora and self.lora_rank < 1:
            raise ValueError(f"lora_rank must be >= 1, got {self.lora_rank}")
        if self.lora_layers < 0:
            raise ValueError(f"lora_layers must be >= 0 (0: every layer), got {self.lora_layers}")
        if self.grad_clip < 0:
            raise ValueError(f"grad_clip must be >= 0, got {self.grad_clip}")
        if self.gradient_checkpointing not in GRADIENT_CHECKPOINTING:
            raise ValueError(
                f"gradient_checkpointing must be one of {', '.join(GRADIENT_CHECKPOINTING)}, "
                f"got {self.gradient_checkpointing!r}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )


class Policy:
    """The model being trained and everything a training step needs beside it."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: PolicyConfig,
        *,
        base: str,
        reference: PreTrainedModel | None = None,
        step: int = 0,
        parallel: Parallel = ALONE,
    ) -> None:
        self.model = model  # the transformers (or peft) model; its parameters may be shards
        self.tokenizer = tokenizer
        self.config = config
        self.base = base  # what the weights started from: a name, folder or hub id
        self.step = step
        self.parallel = parallel
        self.device = (
            torch.device(parallel.device) if parallel.active else next(model.parameters()).device
        )
        self.autocast_dtype = (
            preferred_dtype(self.device.type) if config.precision == "auto" else torch.float32
        )
        self.parameter_count = sum(p.numel() for p in model.parameters())
        self.checkpointing = config.gradient_checkpointing == "on" or (
            config.gradient_checkpointing == "auto" and self.parameter_count >= CHECKPOINTING_FROM
        )
        if self.checkpointing:
            recompute(model, True)
        # "auto" below CHECKPOINTING_FROM decides pass by pass, on one process only (under DDP or
        # FSDP every process must recompute alike, or their collectives would not pair up).
        auto = config.gradient_checkpointing == "auto"
        self.auto_checkpointing = auto and not self.checkpointing and not parallel.active
        self.activation_cost: dict[bool, ActivationCost] = {}  # by kind: packed rows or not
        self.memory_free = free_memory  # bytes free on a device, read before each "auto" pass
        # The last pass "auto" recomputed: its activations' estimated bytes, and the bytes free.
        self.recomputed_memory: tuple[float, int] | None = None
        # The last logit chunk "auto" shortened: (positions it took, positions configured).
        self.shortened_logit_chunk: tuple[int, int] | None = None
        self._recomputing = self.checkpointing
        # Under bf16 autocast every pass rounds the frozen Linear weights a LoRA adapts to bf16
        # anyway: holding them so gives the same products without an fp32 copy (0.72 GB of
        # Qwen2.5-Coder-0.5B's 2.0) and without a cast per pass (`frozen_linear_to`).
        self.frozen_dtype = torch.float32
        if config.lora and self.autocast_dtype != torch.float32 and not parallel.active:
            self.frozen_dtype = frozen_linear_to(model, self.autocast_dtype)
        sharded = parallel.sharding == "fsdp"
        # The per-token log-probs as one module, owned by the data-parallel wrapper (FSDP2 or
        # DDP), which reduces the gradients.
        try:
            scorer = TokenLogprobs(model)
        except ValueError as error:  # no decoder and head to call apart, soft-capped logits
            raise ModelError(str(error)) from error
        self.scorer = parallel.wrap(
            scorer, decoder_layers(model) if sharded else [], self.autocast_dtype
        )
        self._reference = None
        if reference is not None:
            self._reference = parallel.wrap(
                TokenLogprobs(reference),
                decoder_layers(reference) if sharded else [],
                self.autocast_dtype,
            )
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            trainable, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )

    @classmethod
    def load(
        cls,
        name: str,
        config: PolicyConfig = PolicyConfig(),
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        parallel: Parallel = ALONE,
    ) -> Policy:
        """Start from `name`: the embedded model, a Hugging Face folder or hub id, a GGUF file;
        wrapped for `parallel`'s processes."""
        tokenizer = load_tokenizer(name, cache_dir)
        # Master weights in fp32 whatever the hardware: bf16 only inside autocast.
        model = load_model(name, dtype=torch.float32, device=config.device, cache_dir=cache_dir)
        reference = None
        if config.lora:
            model = with_lora(model, config)
        elif config.reference:
            reference = frozen_copy(model)
        model.train()
        return cls(model, tokenizer, config, base=name, reference=reference, parallel=parallel)

    @classmethod
    def resume(
        cls,
        folder: str | os.PathLike[str],
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        device: str | None = None,
        parallel: Parallel = ALONE,
    ) -> Policy:
        """A policy saved by `save`, with its optimiser state and step counter, wrapped for
        `parallel`'s processes (a sharded save resumes on any number of them)."""
        folder = Path(folder)
        try:
            state = json.loads((folder / STATE_FILE).read_text())
        except (OSError, ValueError) as error:
            raise ModelError(f"{folder} is not a saved policy: {error}") from error
        config = PolicyConfig(**{**state["config"], "betas": tuple(state["config"]["betas"])})
        if parallel.active:
            device = parallel.device
        if device is not None:
            config = PolicyConfig(**{**asdict(config), "device": device})
        # An adapter folder is not a model folder: the tokenizer is the base model's.
        tokenizer = load_tokenizer(state["base"] if config.lora else str(folder), cache_dir)
        if config.lora:
            from peft import PeftModel

            base = load_model(
                state["base"], dtype=torch.float32, device=config.device, cache_dir=cache_dir
            )
            model = PeftModel.from_pretrained(base, str(folder), is_trainable=True)
            reference = None
        else:
            model = load_model(
                str(folder), dtype=torch.float32, device=config.device, cache_dir=cache_dir
            )
            # The reference is the policy the training started from, not this checkpoint.
            reference = (
                frozen_copy(
                    load_model(
                        state["base"],
                        dtype=torch.float32,
                        device=config.device,
                        cache_dir=cache_dir,
                    )
                )
                if config.reference
                else None
            )
        model.train()
        policy = cls(
            model,
            tokenizer,
            config,
            base=state["base"],
            reference=reference,
            step=state["step"],
            parallel=parallel,
        )
        optimizer_state = folder / OPTIMIZER_FILE
        if (folder / SHARDED_FOLDER).exists():
            policy._load_sharded(folder / SHARDED_FOLDER)
        elif optimizer_state.exists() and parallel.sharding == "fsdp":
            raise ModelError(
                f"{folder} was saved by one process (optimizer.pt): resume it unsharded "
                "(--sharding ddp or one process), or start afresh"
            )
        elif optimizer_state.exists():
            policy.optimizer.load_state_dict(
                torch.load(optimizer_state, map_location=policy.device, weights_only=True)
            )
        return policy

    # -- forward passes --------------------------------------------------------------------

    def generation_context(self) -> contextlib.AbstractContextManager[Any]:
        """What a generator sampling from this very model runs under: the autocast its frozen
        bf16 weights need (`frozen_linear_to`), else nothing (it samples in fp32)."""
        if self.frozen_dtype == torch.float32:
            return contextlib.nullcontext()
        return self.autocast()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast where the hardware runs bf16 natively; nothing otherwise, and nothing
        under FSDP, whose mixed precision casts the weights itself."""
        if self.autocast_dtype == torch.float32 or self.parallel.sharding == "fsdp":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @contextlib.contextmanager
    def reference_scorer(self) -> Iterator[torch.nn.Module | None]:
        """The frozen reference's TokenLogprobs to compute KL against, or None when there is
        none (with LoRA: the policy's own, its adapter switched off)."""
        if self.config.lora and self.config.reference:
            with self.model.disable_adapter():
                yield self.scorer
        else:
            yield self._reference

    @property
    def has_reference(self) -> bool:
        return self.config.reference and (self.config.lora or self._reference is not None)

    def checkpoint_pass(self, batch: dict[str, torch.Tensor], logit_chunk: int) -> bool:
        """Whether the training pass over `batch` recomputes its activations in the backward
        pass; under "auto" (one process, below CHECKPOINTING_FROM parameters) turned on for
        this pass when its activations would take more than SHARE of the memory free."""
        if not self.auto_checkpointing:
            return self.checkpointing
        needed = pass_needs_recompute(self, batch, logit_chunk)
        if needed != self._recomputing:
            recompute(self.model, needed)
            self._recomputing = needed
        return needed

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    # -- checkpoints -----------------------------------------------------------------------

    def save(self, folder: str | os.PathLike[str], *, optimizer: bool = True) -> Path:
        """Weights (or adapter), tokenizer, optimiser state and step into `folder`, atomically.
        Every process calls it; sharded, each writes its shards and the main process the
        consolidated weights."""
        sharded = self.parallel.sharding == "fsdp"
        with _atomic_folder(folder, self.parallel) as staging:
            if sharded:
                self._save_sharded(staging / SHARDED_FOLDER, optimizer)
            weights = self._full_state_dict() if sharded else None
            if self.parallel.main:
                self.model.save_pretrained(staging, state_dict=weights, safe_serialization=True)
                self.tokenizer.save_pretrained(staging)
                if optimizer and not sharded:
                    torch.save(self.optimizer.state_dict(), staging / OPTIMIZER_FILE)
                config = asdict(self.config)
                config["device"] = None
                state = {"step": self.step, "base": self.base, "config": config}
                state["sharded"] = sharded
                (staging / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        return Path(folder)

    def save_merged(
        self, folder: str | os.PathLike[str], *, dtype: torch.dtype | None = None
    ) -> Path:
        """A plain Hugging Face model folder any backend loads (`vpo run --model DIR`): the
        full weights, with a LoRA adapter merged in, in `dtype` (default: the fp32 master
        weights'). Every process calls it; the main writes."""
        sharded = self.parallel.sharding == "fsdp"
        cast = dtype is not None and dtype != torch.float32
        weights = self._full_state_dict() if sharded else None
        with _atomic_folder(folder, self.parallel) as staging:
            if self.parallel.main:
                model = self.model
                if sharded:  # a whole copy on the main process, from the gathered weights
                    model = self._unsharded_copy(weights)
                elif self.config.lora or cast:  # the trained model itself stays as it is
                    model = copy.deepcopy(self.model)
                if self.frozen_dtype != torch.float32 and not sharded:
                    model = model.float()  # merged in fp32 as below, not in the frozen dtype
                if self.config.lora:
                    model = model.merge_and_unload()
                if cast:  # merged in fp32 first: the adapter's update is not rounded twice
                    model = model.to(dtype)
                model.save_pretrained(staging, safe_serialization=True)
                self.tokenizer.save_pretrained(staging)
        return Path(folder)

    def engine_weights(
        self, dtype: torch.dtype | None = None
    ) -> Iterator[tuple[str, torch.Tensor]] | None:
        """The whole weights for a generator in this process, one tensor at a time under the
        model's own (Hugging Face) names, a LoRA adapter merged in fp32 and then cast to
        `dtype`: what `save_merged` writes, with nothing written. None where this process
        holds a shard only (FSDP)."""
        if self.parallel.sharding == "fsdp":
            return None
        return self._engine_weights(dtype)

    def _engine_weights(self, dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
        model = self.model.get_base_model() if self.config.lora else self.model
        adapted = dict(model.named_modules())
        for name, parameter in model.named_parameters():
            owner, _, leaf = name.rpartition(".")
            if ".lora_" in f".{name}":
                continue
            with torch.no_grad():  # not across the yield: the caller's grad mode stays its own
                value = parameter.detach()
                if owner.endswith(".base_layer"):  # a layer LoRA adapts: W + scale B A
                    owner = owner.removesuffix(".base_layer")
                    if leaf == "weight":
                        value = value + adapted[owner].get_delta_weight("default")
                    name = f"{owner}.{leaf}"
                if dtype is not None:
                    value = value.to(dtype)
            yield name, value

    def _full_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's whole state gathered into the main process's memory (empty elsewhere),
        under the model's own names."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        gathered = get_model_state_dict(self.scorer, options=options)
        return {_own_name(key): value for key, value in gathered.items()}

    def _unsharded_copy(self, weights: dict[str, torch.Tensor]) -> PreTrainedModel:
        model = load_model(self.base, dtype=torch.float32, device="cpu")
        if self.config.lora:
            model = with_lora(model, self.config)
        result = model.load_state_dict(weights, strict=False)
        missing = [k for k in result.missing_keys if k not in _tied_names(model)]
        if missing or result.unexpected_keys:
            raise RuntimeError(
                f"the gathered weights do not fit {self.base}: missing {missing[:3]}, "
                f"unexpected {result.unexpected_keys[:3]}"
            )
        return model

    def _save_sharded(self, folder: Path, optimizer: bool) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        weights, moments = get_state_dict(self.scorer, self.optimizer, options=_trained_only())
        state = {"model": weights, "optimizer": moments} if optimizer else {"model": weights}
        dcp.save(state, checkpoint_id=str(folder))

    def _load_sharded(self, folder: Path) -> None:
        """Weights and optimiser state from a torch.distributed.checkpoint folder, resharded
        onto this run's processes."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        weights, moments = get_state_dict(self.scorer, self.optimizer, options=_trained_only())
        state = {"model": weights, "optimizer": moments}
        alone = not self.parallel.active
        with warnings.catch_warnings():
            # One process reading a sharded checkpoint is meant; torch warns that it assumes so.
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            try:
                dcp.load(state, checkpoint_id=str(folder), no_dist=alone)
            except Exception as error:  # a checkpoint without optimiser state: the weights
                if "optimizer" not in str(error):
                    raise ModelError(f"{folder} cannot be loaded: {error}") from error
                state = {"model": weights}
                dcp.load(state, checkpoint_id=str(folder), no_dist=alone)
        set_state_dict(
            self.scorer,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state.get("optimizer", {}),
            options=_trained_only(strict=False),  # the frozen base came from the folder
        )


def _trained_only(strict: bool = True) -> Any:
    """What a sharded checkpoint holds of the model: the weights being trained (a LoRA
    version's frozen base is the base model's, not written again with every version)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=strict)


def _tied_names(model: Any) -> set[str]:
    """State keys that share their tensor with an earlier key (tied embeddings)."""
    seen: set[int] = set()
    tied = set()
    for key, value in model.state_dict(keep_vars=True).items():
        if id(value) in seen:
            tied.add(key)
        seen.add(id(value))
    return tied


def _own_name(key: str) -> str:
    """A TokenLogprobs state key as the transformers model names it ("model.x" -> "x")."""
    return key.removeprefix("model.")


@contextlib.contextmanager
def _atomic_folder(folder: str | os.PathLike[str], parallel: Parallel = ALONE) -> Iterator[Path]:
    """A staging folder beside `folder` that replaces it when the block ends without error.
    Every process gets the same staging folder (a file system they share); the main process
    renames it once all are done."""
    folder = Path(folder)
    staging = None
    if parallel.main:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    staging = Path(parallel.broadcast(str(staging)))
    try:
        yield staging
        parallel.barrier()
        if parallel.main:
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(staging, folder)
        parallel.barrier()
    except BaseException:
        if parallel.main:
            shutil.rmtree(staging, ignore_errors=True)
        raise
