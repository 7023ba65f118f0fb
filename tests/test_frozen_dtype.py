"""A LoRA policy trained under bf16 autocast holds its frozen Linear weights in bf16
(`trainer.adapters.frozen_linear_to`): autocast rounded them so in every pass, so the products,
the log-probs and the adapter's gradients are the same, bit for bit; it takes less memory; a
merge for publishing is made in fp32; and a generator sampling from the very model (the
transformers backend) runs under the policy's autocast and samples what it sampled before."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from harness.llm import Sampling
from harness.llm.transformers_backend import TransformersGenerator
from trainer.adapters import frozen_linear_to
from trainer.logprobs import completion_logprobs, token_batch
from trainer.models import preferred_dtype
from trainer.policy import Policy, PolicyConfig

ROWS = [([5, 9, 14, 3, 8], [21, 7, 30], None), ([11, 4, 6], [2, 19, 25, 13], None)]
MESSAGES = [[{"role": "user", "content": "Name three prime numbers."}]]


def adapted(tiny_model: str, precision: str = "float32") -> Policy:
    """A LoRA policy whose adapter is not zero (B drawn), so that it changes the products."""
    torch.manual_seed(3)
    config = PolicyConfig(lr=1e-3, lora=True, lora_rank=4, reference=False, precision=precision)
    policy = Policy.load(tiny_model, config)
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.05)
    return policy


def logprobs_and_grads(policy: Policy) -> tuple[torch.Tensor, list[torch.Tensor]]:
    policy.model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logprobs = completion_logprobs(policy.model, token_batch(ROWS), 1.0)
    logprobs.sum().backward()
    grads = [p.grad.clone() for p in policy.model.parameters() if p.requires_grad]
    return logprobs.detach(), grads


def held_bytes(policy: Policy) -> int:
    return sum(p.numel() * p.element_size() for p in policy.model.parameters())


def test_bf16_frozen_weights_give_what_autocast_gave(tiny_model: str) -> None:
    policy = adapted(tiny_model)
    before, grads_before = logprobs_and_grads(policy)
    bytes_before = held_bytes(policy)
    frozen_linear_to(policy.model, torch.bfloat16)
    after, grads_after = logprobs_and_grads(policy)
    assert torch.equal(before, after)
    assert len(grads_before) == len(grads_after) > 0
    assert all(torch.equal(a, b) for a, b in zip(grads_before, grads_after, strict=True))
    assert any(g.abs().sum() > 0 for g in grads_after)
    assert held_bytes(policy) < bytes_before
    # What is trained, the embedding (the residual stream's start) and the norms stay fp32.
    model = policy.model
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    assert model.get_input_embeddings().weight.dtype == torch.float32
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "norm" in n.lower())


def test_a_lora_policy_holds_them_so_where_it_computes_in_bf16(tiny_model: str) -> None:
    auto = adapted(tiny_model, precision="auto")
    assert auto.frozen_dtype == preferred_dtype("cpu")  # bf16 on AVX-512 BF16 or AMX, else fp32
    assert adapted(tiny_model).frozen_dtype == torch.float32  # precision float32: no autocast


def test_a_merge_is_made_in_fp32(tiny_model: str, tmp_path) -> None:
    policy = adapted(tiny_model)
    frozen_linear_to(policy.model, torch.bfloat16)
    policy.frozen_dtype = torch.bfloat16
    base = policy.model.get_base_model()
    layer = dict(base.named_modules())["model.layers.0.self_attn.q_proj"]
    expected = layer.base_layer.weight.float() + layer.get_delta_weight("default").float()
    weights = load_file(str(policy.save_merged(tmp_path / "merged") / "model.safetensors"))
    assert torch.equal(weights["model.layers.0.self_attn.q_proj.weight"], expected)
    streamed = dict(policy.engine_weights())
    assert torch.equal(streamed["model.layers.0.self_attn.q_proj.weight"], expected)
    # The trained model itself is left in its dtypes.
    assert layer.base_layer.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("frozen", [False, True])
def test_a_generator_on_the_trainers_model_samples_under_its_autocast(
    tiny_model: str, frozen: bool
) -> None:
    """With bf16 frozen weights the wrapped model needs the policy's autocast to run at all;
    under it, it samples token for token what the fp32 copies sampled under autocast."""
    sampling = Sampling(temperature=0.9, top_p=1.0, max_tokens=12, seed=11)
    policy = adapted(tiny_model)
    if frozen:
        frozen_linear_to(policy.model, torch.bfloat16)

    def autocast() -> torch.autocast:
        return torch.autocast("cpu", dtype=torch.bfloat16)

    generator = TransformersGenerator(
        "tiny", hf_model=policy.model, tokenizer=policy.tokenizer, context=autocast
    )
    tokens = [c.token_ids for c in generator.generate(MESSAGES, 3, sampling)[0]]
    if frozen:
        reference = adapted(tiny_model)
        again = TransformersGenerator(
            "tiny", hf_model=reference.model, tokenizer=reference.tokenizer, context=autocast
        )
        assert tokens == [c.token_ids for c in again.generate(MESSAGES, 3, sampling)[0]]
    assert all(len(t) > 0 for t in tokens)
