"""A LoRA adapter on the top N decoder layers only (`lora_layers`): the layers below run
forward only (no gradient reaches them, so a step's backward stops at the lowest adapted
layer), the adapter survives a save and a resume, and a version merged for an engine computes
what the policy computes."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from harness.config.errors import UserError
from harness.config.training import TrainSettings
from trainer.logprobs import completion_logprobs, token_batch
from trainer.models import ModelError
from trainer.policy import Policy, PolicyConfig

ROWS = [([5, 9, 14, 3, 8], [21, 7, 30], None), ([11, 4, 6], [2, 19, 25, 13], None)]


def top_layer_policy(tiny_model: str) -> Policy:
    torch.manual_seed(5)
    config = PolicyConfig(lr=1e-3, lora=True, lora_rank=4, lora_layers=1, reference=False,
                          precision="float32")  # fmt: skip
    policy = Policy.load(tiny_model, config)
    with torch.no_grad():  # B drawn, so that the adapter changes the products
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.05)
    return policy


def adapted_layers(policy: Policy) -> set[int]:
    names = [name for name, p in policy.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in name for name in names)
    return {int(name.split(".layers.")[1].split(".")[0]) for name in names}


def test_the_adapter_sits_on_the_top_layers_and_the_backward_stops_there(
    tiny_model: str, tmp_path
) -> None:
    policy = top_layer_policy(tiny_model)
    assert adapted_layers(policy) == {1}  # the tiny model has layers 0 and 1
    whole = Policy.load(tiny_model, PolicyConfig(lora=True, lora_rank=4, reference=False))
    assert adapted_layers(whole) == {0, 1}

    # What enters layer 1 (layer 0's output) carries no gradient; what leaves it does.
    batch = token_batch(ROWS)
    out = policy.model(input_ids=batch["input_ids"], output_hidden_states=True)
    assert not out.hidden_states[1].requires_grad
    assert out.hidden_states[2].requires_grad
    logprobs = completion_logprobs(policy.model, batch, 1.0)
    logprobs.sum().backward()
    grads = [p.grad for p in policy.model.parameters() if p.requires_grad]
    assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)

    # Saved and resumed, the adapter keeps its layers and its values.
    folder = policy.save(tmp_path / "v1")
    resumed = Policy.resume(folder)
    assert resumed.config.lora_layers == 1 and adapted_layers(resumed) == {1}
    with torch.no_grad():
        again = completion_logprobs(resumed.model, batch, 1.0)
    assert torch.allclose(again, logprobs.detach(), atol=1e-6)

    # Merged for an engine, the version computes what the policy computes.
    merged = AutoModelForCausalLM.from_pretrained(policy.save_merged(tmp_path / "merged"))
    with torch.no_grad():
        plain = completion_logprobs(merged, batch, 1.0)
    assert torch.allclose(plain, logprobs.detach(), atol=1e-5)


@pytest.mark.parametrize("top", [1, 0])
def test_recomputing_activations_leaves_the_layers_below_the_adapter_alone(
    tiny_model: str, top: int
) -> None:
    """With activation checkpointing on, no gradient enters the layers below the adapter (nor
    the embedding, with an adapter on every layer), and the adapter's gradients are those of
    a pass that keeps its activations."""
    from trainer.adapters import recompute

    def grads(policy: Policy) -> list[torch.Tensor]:
        policy.model.zero_grad()
        completion_logprobs(policy.model, token_batch(ROWS), 1.0).sum().backward()
        return [p.grad.clone() for p in policy.model.parameters() if p.requires_grad]

    torch.manual_seed(5)
    config = PolicyConfig(lora=True, lora_rank=4, lora_layers=top, reference=False,
                          precision="float32", gradient_checkpointing="off")  # fmt: skip
    policy = Policy.load(tiny_model, config)
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.05)
    kept = grads(policy)
    recompute(policy.model, True)
    batch = token_batch(ROWS)
    out = policy.model(input_ids=batch["input_ids"], output_hidden_states=True)
    below = 1 if top else 0  # hidden_states[0] is the embedding's output
    assert not out.hidden_states[below].requires_grad
    recomputed = grads(policy)
    assert len(kept) == len(recomputed)
    for a, b in zip(kept, recomputed, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_more_layers_than_the_model_has_is_one_line(tiny_model: str) -> None:
    with pytest.raises(ModelError, match="^lora_layers must be at most the model's 2 layers"):
        Policy.load(tiny_model, PolicyConfig(lora=True, lora_layers=3, reference=False))
    with pytest.raises(UserError, match="^config key 'lora_layers' must be a whole number >= 0"):
        TrainSettings(lora_layers=-1)
