"""The toolkit's fused MoE path computes what transformers' experts compute: outputs, input gradients and expert
weight gradients, on one MoE block and through the whole tiny gpt-oss with LoRA on attention and experts.
On CPU its fused functions run eagerly; the GPU bench's correctness gate checks the compiled kernels."""

from __future__ import annotations

import pytest
import torch
from toolkit_train.kernels.moe import NAME, register


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("seed", [0, 1])
def test_one_block_matches_the_reference_experts(seed):
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts, GptOssTopKRouter

    register()
    torch.manual_seed(seed)
    config = GptOssConfig(hidden_size=64, intermediate_size=48, num_local_experts=8, num_experts_per_tok=3,
                          num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    experts, router = GptOssExperts(config), GptOssTopKRouter(config)
    for parameter in [*experts.parameters(), router.weight]:
        torch.nn.init.normal_(parameter, std=0.3)  # large enough that the SwiGLU clamps bite
    hidden = torch.randn(53, 64, requires_grad=True)
    probe = torch.randn(53, 64)
    results = {}
    for implementation in ("eager", NAME):
        config._experts_implementation = implementation
        experts.zero_grad()
        hidden.grad = None
        _, scores, indices = router(hidden)
        out = experts(hidden, indices, scores)
        (out * probe).sum().backward()
        results[implementation] = [out, hidden.grad, experts.gate_up_proj.grad, experts.down_proj.grad]
    for got, want in zip(results[NAME], results["eager"], strict=True):
        assert relative(got, want) < 1e-5


def test_the_whole_model_with_expert_lora_has_the_same_loss_and_gradients(tiny_model_path):
    from toolkit_train.run.model import add_lora
    from toolkit_train.settings import LoraSettings
    from transformers import AutoModelForCausalLM

    register()
    lora = LoraSettings(dropout=0.0, target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    ids = torch.randint(0, 1000, (2, 40), generator=torch.Generator().manual_seed(3))
    results = {}
    for implementation in ("grouped_mm", NAME):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32,
                                                     experts_implementation=implementation)  # fmt: skip
        assert model.config._experts_implementation == implementation
        model = add_lora(model, lora, seed=0)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(parameter, std=0.05, generator=torch.Generator().manual_seed(7))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        assert any("experts" in n for n in grads)
        results[implementation] = (loss.detach(), grads)
    (loss_ref, grads_ref), (loss_fused, grads_fused) = results["grouped_mm"], results[NAME]
    assert torch.allclose(loss_fused, loss_ref, rtol=1e-6)
    for name, grad in grads_ref.items():
        assert relative(grads_fused[name], grad) < 1e-5, name
