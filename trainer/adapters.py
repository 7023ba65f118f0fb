"""What a policy's model is made of and how it computes, beside its own weights: a LoRA adapter
on every linear layer (`with_lora`), those layers' frozen weights held in the dtype the passes
compute in (`frozen_linear_to`), activations recomputed in the backward pass or kept
(`recompute`), and a frozen reference copy for the KL term (`frozen_copy`)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from trainer.models import ModelError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Every linear layer of a Llama-style block; peft's "all-linear" picks the same on most models.
LORA_TARGETS = "all-linear"


def with_lora(model: PreTrainedModel, config: Any) -> PreTrainedModel:
    """`model` with a LoRA adapter of `config`'s rank, alpha and dropout (a PolicyConfig), on
    every linear layer of its top `config.lora_layers` decoder layers (0: of all of them)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:  # peft is a dependency; a broken install lands here
        raise ModelError(f"LoRA needs peft ({error}); pip install peft") from error
    layers = int(getattr(model.config, "num_hidden_layers", 0) or 0)
    top = config.lora_layers
    if top and not 0 < top <= layers:
        raise ModelError(f"lora_layers must be at most the model's {layers} layers, not {top}")
    targets: Any = LORA_TARGETS
    chosen: dict[str, Any] = {}
    if top:
        # peft takes a layer range only with the modules named: every Linear of a decoder
        # layer, which is what "all-linear" picks there.
        targets = sorted(
            {
                name.rsplit(".", 1)[-1]
                for name, module in model.named_modules()
                if ".layers." in name and isinstance(module, torch.nn.Linear)
            }
        )
        chosen = {
            "layers_to_transform": list(range(layers - top, layers)),
            "layers_pattern": "layers",
        }
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
        **chosen,
    )
    return get_peft_model(model, lora)


def frozen_linear_to(model: PreTrainedModel, dtype: torch.dtype) -> torch.dtype:
    """Hold the frozen weights and biases of `model`'s Linear layers in `dtype`, the output
    head's aside (it may be the input embedding's weight, and the embedding's output is the
    residual stream, kept in fp32); returns `dtype`. Only for passes under autocast to `dtype`,
    which casts those weights so in every pass: outside it a Linear would meet fp32 inputs."""
    head = model.get_output_embeddings()
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear) or module is head:
            continue
        for parameter in module.parameters(recurse=False):
            if not parameter.requires_grad and parameter.is_floating_point():
                parameter.data = parameter.data.to(dtype)
    return dtype


def recompute(model: Any, on: bool) -> None:
    """Turn activation checkpointing of `model`'s decoder layers on or off."""
    if on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # transformers then makes the embeddings' output require a gradient, which re-entrant
        # checkpointing needs and this one does not: the backward would run down to the
        # embedding through every layer, those below a top-layer adapter included, for a
        # gradient nothing trains on.
        model.disable_input_require_grads()
    else:
        model.gradient_checkpointing_disable()


def frozen_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A copy of `model` that computes and never trains (the KL term's reference)."""
    reference = copy.deepcopy(model)
    reference.eval()
    reference.requires_grad_(False)
    return reference
