"""Bench only, not shipped: FP8 (e4m3) grouped GEMMs for the frozen bf16 experts of gpt-oss, #48's lever, measured
by the bench (bench/train_throughput.py's -fp8 variants, fp8-block, fp8-gemm) and not a setting: on an H100 the
compiled 20b step ran at 0.99x bf16's (docs/performance.md), so nothing in training attaches these copies.

With LoRA on attention the experts are frozen: training needs their forward product and the gradient to their
inputs, never a gradient to their weights. Both products can run on Hopper's FP8 tensor cores (~1.4x bf16's rate on
the 20b expert shape, measured in the issue) with row-wise scales:

    forward        rows [M, in]  @ W [E, in, out]     W quantized per (expert, out) over `in`
    input gradient grad [M, out] @ W^T [E, out, in]   W quantized per (expert, in) over `out`

Hopper's FP8 instructions read both operands along the contraction, so each product needs its own copy of W laid
out along its own contraction (and its own scales): two FP8 copies of the experts, quantized once when the model is
prepared (the weights are frozen) and kept as non-persistent buffers. They take the bf16 experts' place: the bf16
weights' storage is released (two bytes a weight either way; 20b: 38 GB), which nothing in training reads again (a
frozen base has no gradient, checkpoints hold the adapter, and the merge reloads the base from its checkpoint,
train.merge). Rows and gradients are quantized per row on the fly (the compiled decoder layer fuses that into the
surrounding kernels). Scales are float32 amax / 448 (e4m3's largest value).

Not exact: e4m3 keeps 3 mantissa bits, so each product carries a relative error of a few percent per element; what
that does to training is measured against bf16 (bench/train_throughput.py's fp8-gate and fp8-curve, docs/
performance.md). On CPU (tests) the products are emulated in float32 from the same FP8 values and scales.
"""

from __future__ import annotations

from typing import Any

import torch
from toolkit_train.kernels.moe import PRODUCTS_ATTRIBUTE

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
TINY = 1e-12  # an all-zero row gets this amax: its scale stays finite and its values stay 0
# the experts' two projections as transformers' gpt-oss holds them, [E, in, out], and the buffers their copies get
PROJECTIONS = ("gate_up_proj", "down_proj")
COPIES = ("forward", "backward")
# Hopper's FP8 tensor cores: compute capability 8.9 (Ada) and up run torch's row-wise scaled grouped GEMM on 9.0 only
MIN_CAPABILITY = (9, 0)
USE_FUNCTION = False  # the bench's fp8-block only: Fp8GroupedMM (autograd.Function) instead of the custom op


def buffer_name(projection: str, copy: str, part: str) -> str:
    """e.g. fp8_gate_up_proj_forward_values / _scales."""
    return f"fp8_{projection}_{copy}_{part}"


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., n] -> (e4m3 values [..., n], float32 scales [...]) with x ~ values * scales[..., None]: each row's
    largest |value| maps to 448."""
    amax = x.abs().amax(dim=-1).to(torch.float32).clamp(min=TINY)
    scales = amax / E4M3_MAX
    values = (x.to(torch.float32) / scales.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return values, scales


def quantized_copies(weight: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """An expert weight [E, in, out] -> both FP8 copies, each (values, scales) with values contiguous along its
    contraction: forward [E, out, in] with scales [E, out]; backward [E, in, out] with scales [E, in]."""
    with torch.no_grad():
        return {
            "forward": quantize_rows(weight.transpose(1, 2).contiguous()),
            "backward": quantize_rows(weight),
        }


def _emulated_grouped_mm(a, b, a_scales, b_scales, offsets) -> torch.Tensor:
    """What torch._scaled_grouped_mm computes, in float32 on any device: rows [offsets[e-1], offsets[e]) of a times
    expert e of b ([E, k, n]), scales applied to a's rows and b's columns."""
    a = a.to(torch.float32) * a_scales.unsqueeze(-1)
    b = b.to(torch.float32) * b_scales.unsqueeze(1)
    out = torch.zeros(a.shape[0], b.shape[-1], dtype=torch.float32, device=a.device)
    start = 0
    for expert, end in enumerate(offsets.tolist()):
        if end > start:
            out[start:end] = a[start:end] @ b[expert]
        start = end
    return out


def scaled_grouped_mm(
    a, b, a_scales, b_scales, offsets, out_dtype: torch.dtype, fast_accum: bool = False
) -> torch.Tensor:
    """a [M, k] e4m3 row-major, b [E, k, n] e4m3 with k contiguous (a transposed view), a_scales [M], b_scales
    [E, n] -> [M, n] in out_dtype. torch's CUTLASS kernel on a GPU (bf16 out; `fast_accum`: Hopper's FP8
    accumulation without the periodic promotion to fp32, the bench's probe only), emulated in float32 elsewhere."""
    if a.device.type == "cuda":
        out = torch._scaled_grouped_mm(
            a, b, a_scales, b_scales, offs=offsets, out_dtype=torch.bfloat16, use_fast_accum=fast_accum
        )
        return out.to(out_dtype)
    return _emulated_grouped_mm(a, b, a_scales, b_scales, offsets).to(out_dtype)


_COMPILED: dict[str, Any] = {}


def _quantize_rows_fast(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows as one compiled kernel on GPUs (eager elsewhere)."""
    if x.device.type != "cuda":
        return quantize_rows(x)
    if "quantize_rows" not in _COMPILED:
        _COMPILED["quantize_rows"] = torch.compile(quantize_rows, dynamic=True)
    return _COMPILED["quantize_rows"](x)


@torch.library.custom_op("toolkit::fp8_rows_times", mutates_args=())
def fp8_rows_times(
    rows: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """rows [M, k] (quantized here, per row) times each expert's FP8 weight copy (values [E, n, k], k contiguous;
    scales [E, n]) -> [M, n] in rows' dtype. An opaque op: torch.compile keeps it whole (see fp8_grouped_mm)."""
    quantized, row_scales = _quantize_rows_fast(rows)
    return scaled_grouped_mm(quantized, values.transpose(1, 2), row_scales, scales, offsets, rows.dtype)


@fp8_rows_times.register_fake
def _(rows, values, scales, offsets):
    return rows.new_empty(rows.shape[0], values.shape[1])


@torch.library.custom_op("toolkit::fp8_grouped_mm", mutates_args=())
def fp8_grouped_mm(
    rows: torch.Tensor,
    forward_values: torch.Tensor,
    forward_scales: torch.Tensor,
    backward_values: torch.Tensor,
    backward_scales: torch.Tensor,
    offsets: torch.Tensor,
) -> torch.Tensor:
    """rows @ W per expert with W frozen and held as its two FP8 copies; differentiable in the rows only.
    A custom op with its autograd registered, not an autograd.Function: inside a compiled decoder layer, torch 2.11
    traced the autograd.Function version's forward right and lost its backward (the rows' gradient came back zero,
    bench fp8-block on an H100), which made the compiled layers look fast and learn through the residual alone."""
    return fp8_rows_times(rows, forward_values, forward_scales, offsets)


@fp8_grouped_mm.register_fake
def _(rows, forward_values, forward_scales, backward_values, backward_scales, offsets):
    return rows.new_empty(rows.shape[0], forward_values.shape[1])


def _setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    _, _, _, backward_values, backward_scales, offsets = inputs
    ctx.save_for_backward(backward_values, backward_scales, offsets)


def _backward(ctx: Any, grad: torch.Tensor):
    backward_values, backward_scales, offsets = ctx.saved_tensors
    return fp8_rows_times(grad.contiguous(), backward_values, backward_scales, offsets), None, None, None, None, None


fp8_grouped_mm.register_autograd(_backward, setup_context=_setup_context)


class Fp8GroupedMM(torch.autograd.Function):
    """The autograd.Function form of fp8_grouped_mm (the bench's fp8-block compares the two under torch.compile):
    right eagerly; compiled, its backward was lost."""

    @staticmethod
    def forward(ctx: Any, rows, forward_values, forward_scales, backward_values, backward_scales, offsets):
        ctx.save_for_backward(backward_values, backward_scales, offsets)
        values, scales = quantize_rows(rows)
        return scaled_grouped_mm(values, forward_values.transpose(1, 2), scales, forward_scales, offsets, rows.dtype)

    @staticmethod
    def backward(ctx: Any, grad):
        backward_values, backward_scales, offsets = ctx.saved_tensors
        values, scales = quantize_rows(grad)
        rows_grad = scaled_grouped_mm(
            values, backward_values.transpose(1, 2), scales, backward_scales, offsets, grad.dtype
        )
        return rows_grad, None, None, None, None, None


def fp8_projection(experts: torch.nn.Module, projection: str):
    """`run(rows, offsets)` for moe.fused_experts: the projection through its FP8 copies."""
    parts = [getattr(experts, buffer_name(projection, copy, part)) for copy in COPIES for part in ("values", "scales")]

    def run(rows, offsets):
        if USE_FUNCTION:
            return Fp8GroupedMM.apply(rows, *parts, offsets)
        return fp8_grouped_mm(rows, *parts, offsets)

    return run


def fp8_products(experts: torch.nn.Module) -> tuple:
    """The experts' two products through their FP8 copies (moe.PRODUCTS_ATTRIBUTE's contract)."""
    return fp8_projection(experts, "gate_up_proj"), fp8_projection(experts, "down_proj")


def has_fp8_copies(experts: torch.nn.Module) -> bool:
    return hasattr(experts, buffer_name(PROJECTIONS[0], COPIES[0], "values"))


def unsupported_here(device: torch.device) -> str | None:
    """Why FP8 experts cannot run on `device` (None: they can; a CPU emulates them)."""
    if device.type != "cuda":
        return None
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (
            f"FP8 experts need a GPU of compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
            f"(H100/H200); {name} is {capability[0]}.{capability[1]}"
        )
    return None


def attach_fp8_experts(model: torch.nn.Module, release: bool = True) -> int:
    """Give every gpt-oss experts module with frozen bf16 weights its FP8 copies (non-persistent buffers: not in
    checkpoints or the merged model), one layer at a time, and release the bf16 weights' storage (`release`; the
    parameters stay, empty); returns how many modules. Raises ValueError where a weight trains (expert LoRA on bf16
    experts reaches the weights themselves) or the GPU cannot run FP8."""
    count = 0
    for name, module in model.named_modules():
        found = [getattr(module, projection, None) for projection in PROJECTIONS]
        weights = [w for w in found if isinstance(w, torch.Tensor) and w.dim() == 3]
        if len(weights) != len(PROJECTIONS):
            continue
        if any(w.requires_grad for w in weights):
            raise ValueError(
                f"FP8 experts: {name}'s expert weights train (LoRA on bf16 experts adapts them "
                "through the weights); FP8 copies serve frozen experts only"
            )
        problem = unsupported_here(weights[0].device)
        if problem:
            raise ValueError(problem)
        for projection, weight in zip(PROJECTIONS, weights, strict=True):
            for copy, (values, scales) in quantized_copies(weight).items():
                module.register_buffer(buffer_name(projection, copy, "values"), values, persistent=False)
                module.register_buffer(buffer_name(projection, copy, "scales"), scales, persistent=False)
            if release:
                weight.data = weight.data.new_empty(0)
        setattr(module, PRODUCTS_ATTRIBUTE, fp8_products)  # moe.fused_experts_forward runs these products
        count += 1
    return count
