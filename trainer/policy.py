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
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.models import ModelError, load_model, load_tokenizer, preferred_dtype

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

STATE_FILE = "policy.json"
OPTIMIZER_FILE = "optimizer.pt"
# Every linear layer of a Llama-style block; peft's "all-linear" picks the same on most models.
LORA_TARGETS = "all-linear"


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
    reference: bool = True  # keep a frozen reference for the KL term
    device: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.lora and self.lora_rank < 1:
            raise ValueError(f"lora_rank must be >= 1, got {self.lora_rank}")
        if self.grad_clip < 0:
            raise ValueError(f"grad_clip must be >= 0, got {self.grad_clip}")


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
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.base = base  # what the weights started from: a name, folder or hub id
        self._reference = reference
        self.step = step
        self.device = next(model.parameters()).device
        self.autocast_dtype = preferred_dtype(self.device.type)
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
    ) -> Policy:
        """Start from `name`: the embedded model, a Hugging Face folder or hub id, a GGUF file."""
        tokenizer = load_tokenizer(name, cache_dir)
        # Master weights in fp32 whatever the hardware: bf16 only inside autocast.
        model = load_model(name, dtype=torch.float32, device=config.device, cache_dir=cache_dir)
        reference = None
        if config.lora:
            model = _with_lora(model, config)
        elif config.reference:
            reference = _frozen_copy(model)
        model.train()
        return cls(model, tokenizer, config, base=name, reference=reference)

    @classmethod
    def resume(
        cls,
        folder: str | os.PathLike[str],
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        device: str | None = None,
    ) -> Policy:
        """A policy saved by `save`, with its optimiser state and step counter."""
        folder = Path(folder)
        try:
            state = json.loads((folder / STATE_FILE).read_text())
        except (OSError, ValueError) as error:
            raise ModelError(f"{folder} is not a saved policy: {error}") from error
        config = PolicyConfig(**{**state["config"], "betas": tuple(state["config"]["betas"])})
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
                _frozen_copy(
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
            model, tokenizer, config, base=state["base"], reference=reference, step=state["step"]
        )
        optimizer_state = folder / OPTIMIZER_FILE
        if optimizer_state.exists():
            policy.optimizer.load_state_dict(
                torch.load(optimizer_state, map_location=policy.device, weights_only=True)
            )
        return policy

    # -- forward passes --------------------------------------------------------------------

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast where the hardware runs bf16 natively; nothing otherwise."""
        if self.autocast_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @contextlib.contextmanager
    def reference_model(self) -> Iterator[PreTrainedModel | None]:
        """The frozen reference to compute KL against, or None when there is none."""
        if self.config.lora and self.config.reference:
            with self.model.disable_adapter():
                yield self.model
        else:
            yield self._reference

    @property
    def has_reference(self) -> bool:
        return self.config.reference and (self.config.lora or self._reference is not None)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    # -- checkpoints -----------------------------------------------------------------------

    def save(self, folder: str | os.PathLike[str], *, optimizer: bool = True) -> Path:
        """Weights (or adapter), tokenizer, optimiser state and step into `folder`, atomically."""
        with _atomic_folder(folder) as staging:
            self.model.save_pretrained(staging, safe_serialization=True)
            self.tokenizer.save_pretrained(staging)
            if optimizer:
                torch.save(self.optimizer.state_dict(), staging / OPTIMIZER_FILE)
            config = asdict(self.config)
            config["device"] = None
            state = {"step": self.step, "base": self.base, "config": config}
            (staging / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        return Path(folder)

    def save_merged(self, folder: str | os.PathLike[str]) -> Path:
        """A plain Hugging Face model folder any backend loads (`vpo run --model DIR`): the
        full weights, with a LoRA adapter merged in."""
        with _atomic_folder(folder) as staging:
            model = self.model
            if self.config.lora:
                model = copy.deepcopy(self.model).merge_and_unload()
            model.save_pretrained(staging, safe_serialization=True)
            self.tokenizer.save_pretrained(staging)
        return Path(folder)


@contextlib.contextmanager
def _atomic_folder(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """A staging folder beside `folder` that replaces it when the block ends without error."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        yield staging
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _with_lora(model: PreTrainedModel, config: PolicyConfig) -> PreTrainedModel:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:  # peft is a dependency; a broken install lands here
        raise ModelError(f"LoRA needs peft ({error}); pip install peft") from error
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=LORA_TARGETS,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def _frozen_copy(model: PreTrainedModel) -> PreTrainedModel:
    reference = copy.deepcopy(model)
    reference.eval()
    reference.requires_grad_(False)
    return reference
