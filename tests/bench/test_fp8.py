"""FP8 experts (bench/fp8.py, bench only, #48's lever, measured by the bench and not a setting: it did not pay): the
frozen experts' products through their FP8 copies. On this CPU the scaled grouped GEMM is emulated in float32 from
the same e4m3 values and scales (torch's CUTLASS kernel needs a Hopper GPU: the bench's fp8-block and fp8-gemm
compare the two there); what runs here is everything else: the quantization, both copies' layouts and scales and
the autograd path, eager and compiled."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from toolkit_train.kernels.moe import NAME, register

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import fp8


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_rows_quantize_to_e4m3_within_its_rounding():
    torch.manual_seed(0)
    x = torch.randn(37, 96) * torch.logspace(-3, 3, 37).unsqueeze(-1)  # rows of very different magnitude
    x[5] = 0.0
    values, scales = fp8.quantize_rows(x)
    assert values.dtype == torch.float8_e4m3fn and scales.shape == (37,)
    back = values.to(torch.float32) * scales.unsqueeze(-1)
    assert torch.equal(back[5], torch.zeros(96))  # an all-zero row stays zero (finite scale)
    assert torch.allclose(values.to(torch.float32).abs().amax(-1)[torch.arange(37) != 5], torch.tensor(448.0))
    # e4m3 keeps 3 mantissa bits: half a unit in the last place is 2^-4 of a value (subnormals: of the row's max)
    error = (back - x).abs()
    assert bool((error <= 2**-4 * x.abs() + 2**-9 * x.abs().amax(-1, keepdim=True) * 448 / 448).all())
    assert relative(back, x) < 0.03


def _block(seed: int):
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts, GptOssTopKRouter

    register()
    torch.manual_seed(seed)
    config = GptOssConfig(hidden_size=64, intermediate_size=48, num_local_experts=8, num_experts_per_tok=3,
                          num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    config._experts_implementation = NAME
    experts, router = GptOssExperts(config), GptOssTopKRouter(config)
    for parameter in [*experts.parameters(), router.weight]:
        torch.nn.init.normal_(parameter, std=0.3)
    experts.requires_grad_(False)
    return experts, router


@pytest.mark.parametrize("seed", [0, 1])
def test_fp8_experts_compute_the_bf16_experts_product_to_e4m3_precision(seed):
    """Outputs and input gradients within e4m3's error of the exact experts (and not equal: the copies are used);
    nothing reaches the frozen weights; the copies stay out of the state dict (checkpoints, merges)."""
    experts, router = _block(seed)
    hidden = torch.randn(53, 64, requires_grad=True)
    probe = torch.randn(53, 64)
    results = {}
    for use_fp8 in (False, True):
        if use_fp8:
            keys = set(experts.state_dict())
            assert fp8.attach_fp8_experts(experts) == 1
            assert set(experts.state_dict()) == keys
        hidden.grad = None
        _, scores, indices = router(hidden)
        out = experts(hidden, indices, scores)
        (out * probe).sum().backward()
        results[use_fp8] = (out.detach(), hidden.grad.clone())
    for got, want in zip(results[True], results[False], strict=True):
        assert 1e-4 < relative(got, want) < 0.08
    assert all(p.grad is None for p in experts.parameters())


def test_a_compiled_fp8_block_has_the_eager_blocks_gradient():
    """Under torch.compile (dynamo + AOTAutograd; aot_eager: no code generation on this CPU) the FP8 product keeps
    its registered backward: an autograd.Function form of it lost the backward inside compiled layers on an H100
    (the rows' gradient came back zero: bench fp8-block)."""
    experts, router = _block(4)
    fp8.attach_fp8_experts(experts)
    hidden = torch.randn(61, 64)
    _, scores, indices = router(hidden)
    probe = torch.randn(61, 64)
    grads = []
    for module in (experts, torch.compile(experts, backend="aot_eager", fullgraph=True)):
        x = hidden.clone().requires_grad_(True)
        (module(x, indices, scores.detach()) * probe).sum().backward()
        grads.append(x.grad)
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)


def test_both_copies_hold_the_weight_along_their_own_contraction_in_its_place():
    experts, _ = _block(2)
    weights = {projection: getattr(experts, projection).detach().clone() for projection in fp8.PROJECTIONS}
    fp8.attach_fp8_experts(experts)
    for projection in fp8.PROJECTIONS:
        assert getattr(experts, projection).numel() == 0  # released: the copies take its memory
        weight = weights[projection]  # [E, in, out]
        copy = {c: [getattr(experts, fp8.buffer_name(projection, c, p)) for p in ("values", "scales")]
                for c in fp8.COPIES}  # fmt: skip
        forward = copy["forward"][0].float() * copy["forward"][1].unsqueeze(-1)  # [E, out, in]
        backward = copy["backward"][0].float() * copy["backward"][1].unsqueeze(-1)  # [E, in, out]
        assert relative(forward.transpose(1, 2), weight) < 0.03 and relative(backward, weight) < 0.03
        assert copy["forward"][0].is_contiguous() and copy["backward"][0].is_contiguous()


def test_trainable_experts_get_no_fp8_copies():
    experts, _ = _block(3)
    experts.requires_grad_(True)
    with pytest.raises(ValueError, match="expert weights train"):
        fp8.attach_fp8_experts(experts)
