"""A leaner MoE path for gpt-oss training, registered as transformers' experts implementation `toolkit_fused`.

transformers' `grouped_mm` path runs the experts' two grouped GEMMs well, but around them it materialises a
per-row copy of each bias ([tokens x top-k, 2 x intermediate] and [.., hidden]), runs the clamped SwiGLU as
about eight separate elementwise kernels on strided halves, and un-permutes the rows with another gather before
summing over top-k. Measured on one MoE block (20b shape, 12,288 tokens, forward + backward): that glue is more
than half of the block's time. Here the same arithmetic is split into:

    sort by expert -> gather rows -> grouped GEMM -> [bias + clamped SwiGLU]  -> grouped GEMM
                   -> [bias, routing weight, un-permute, sum over top-k]

where each bracket is one function that torch.compile fuses into a kernel (and its backward into another), so
the glue reads and writes each activation once. The GEMMs are transformers' own grouped_mm. Gradients flow to the
input rows (LoRA on attention) and to the expert weights (LoRA on the experts through PEFT's target_parameters).
On CPU the bracketed functions run eagerly (no compiler needed); tests/toolkit_train/kernels/test_moe.py pins that the
path computes the reference experts' outputs and gradients.
"""

from __future__ import annotations

from typing import Any

NAME = "toolkit_fused"
_COMPILED: dict[str, Any] = {}


def _bias_swiglu(h, bias, expert_ids, alpha: float, limit: float):
    """gpt-oss's clamped SwiGLU on interleaved gate/up columns, after the per-expert bias."""
    import torch

    h = h + bias[expert_ids]
    gate, up = h[..., ::2], h[..., 1::2]
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def _bias_weight_combine(y, bias, expert_ids, weights, inverse, num_tokens: int, top_k: int):
    """Per-expert bias, routing weight, rows back in token order, sum over each token's top-k experts."""
    y = (y + bias[expert_ids]) * weights.unsqueeze(-1)
    return y[inverse].view(num_tokens, top_k, -1).sum(dim=1)


def _kernel(name: str, function, device_type: str):
    """Compiled on GPUs (one fused kernel per function and direction); as written elsewhere."""
    if device_type != "cuda":
        return function
    if name not in _COMPILED:
        import torch

        _COMPILED[name] = torch.compile(function, dynamic=True)
    return _COMPILED[name]


# An experts module may carry other products under this attribute: `products(experts) -> (gate_up, down)`, each
# `run(rows, offsets)`. Nothing in training sets it; the bench's FP8 experts do (bench/fp8.py, #48's measured lever).
PRODUCTS_ATTRIBUTE = "replaced_products"


def fused_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Drop-in for transformers' experts forward (same arguments, same result; with other products attached under
    PRODUCTS_ATTRIBUTE, the GEMMs are theirs)."""
    from transformers.integrations.moe import _grouped_mm

    replaced = getattr(self, PRODUCTS_ATTRIBUTE, None)
    if replaced is not None:
        return fused_experts(self, hidden_states, top_k_index, top_k_weights, *replaced(self))

    def gate_up(rows, offsets):
        return _grouped_mm(rows, self.gate_up_proj, offs=offsets)

    def down(rows, offsets):
        return _grouped_mm(rows, self.down_proj, offs=offsets)

    return fused_experts(self, hidden_states, top_k_index, top_k_weights, gate_up, down)


def fused_experts(experts, hidden_states, top_k_index, top_k_weights, gate_up, down):
    """The fused path around two grouped GEMMs `gate_up(rows, offsets)` and `down(rows, offsets)` (bf16 weights
    here, MXFP4 weights dequantized on the fly in kernels/mxfp4.py); `experts` holds the biases and SwiGLU."""
    import torch

    num_tokens, top_k = top_k_index.shape
    device = hidden_states.device
    expert_ids, order = torch.sort(top_k_index.reshape(-1))
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=device)
    rows = hidden_states[order // top_k]
    counts = torch.bincount(expert_ids, minlength=experts.num_experts)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    weights = top_k_weights.reshape(-1)[order]

    swiglu = _kernel("bias_swiglu", _bias_swiglu, device.type)
    activated = swiglu(gate_up(rows, offsets), experts.gate_up_proj_bias, expert_ids, experts.alpha, experts.limit)
    projected = down(activated, offsets)
    combine = _kernel("bias_weight_combine", _bias_weight_combine, device.type)
    out = combine(projected, experts.down_proj_bias, expert_ids, weights.to(projected.dtype), inverse, num_tokens,
                  top_k)  # fmt: skip
    return out.to(hidden_states.dtype)


def register() -> str:
    """Make `experts_implementation="toolkit_fused"` known to transformers (idempotent); returns the name."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if NAME not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(NAME, fused_experts_forward)
    return NAME
