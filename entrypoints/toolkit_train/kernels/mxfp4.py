"""gpt-oss experts kept as the checkpoint's MXFP4 blocks on the GPU, dequantized per layer on the fly
(`model.experts: mxfp4`).

gpt-oss ships its experts in MXFP4: 4-bit e2m1 values, two per byte, and one power-of-two scale per 32 values.
The experts are ~96% of gpt-oss-120b's weights: 61 GB packed against ~230 GB in bf16, so packed the whole model
fits one 141 GB GPU (and the merged model for serving stays ~65 GB). With LoRA on attention the experts are
frozen, so nothing needs them in bf16 for long: each MoE layer dequantizes its experts into a transient bf16
tensor, runs the toolkit's fused MoE path (kernels/moe.py) with it, and frees it; backward dequantizes again
to compute the input gradients (a frozen base has no weight gradients) instead of keeping every layer's bf16
experts alive until then. Dequantization is exact: e2m1 values times powers of two are bf16 numbers, so
logits and LoRA gradients equal those of a model whose experts were dequantized at load time.

Expert LoRA (`lora.target_parameters`) trains on packed experts too (kernels/mxfp4_lora.py): the experts stay
frozen and packed, and each projection's LoRA runs beside its grouped GEMM as two small grouped GEMMs of its own,
rows @ W + scaling * (rows @ A) @ B, so no bf16 copy of W (nor W + delta) outlives the layer. Merging an expert
LoRA into the packed experts requantizes them (`Mxfp4Experts.merge_delta`), which costs accuracy: see the README.

The packed model's RMSNorms run as one compiled kernel per direction on GPUs (`FusedRMSNorm`, same arithmetic as
transformers' GptOssRMSNorm): eager, each norm is ~7 full passes over an fp32 copy of the hidden states forward and
~12 backward, the largest share of the 120b step's glue (docs/performance.md, #48).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

# e2m1: sign bit, 2 exponent bits, 1 mantissa bit (the table in gpt-oss's reference; the code below computes it)
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
SCALE_BIAS = 127  # scales are stored as biased exponents (uint8)
PROJECTIONS = ("gate_up_proj", "down_proj")  # the experts' two weights, named as in transformers and the checkpoints
QUANTIZATION_CONFIG = {  # config.json's entry in the released gpt-oss checkpoints: only the experts are MXFP4
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}
_COMPILED: dict[str, Any] = {}


def _dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[E, out, in/32, 16] uint8 blocks, [E, out, in/32] uint8 scales -> [E, out, in] (low nibble first).
    Decoded with integer arithmetic (2 x |value| = m if e == 0 else (2 + m) << (e - 1)) in one broadcast, so the
    compiler makes it one pass with no intermediate tensors: on an H200 2.06 ms for one 120b layer's gate_up
    (4.25 GB of bf16), against 2.52 ms with a table lookup and 2.00 ms for a plain copy of the same bytes.
    Exact in bf16: an e2m1 value times a power of two."""
    shifts = torch.tensor([0, 4], dtype=torch.uint8, device=blocks.device)
    codes = ((blocks.unsqueeze(-1) >> shifts) & 0x0F).to(torch.int32)  # [E, out, in/32, 16, 2]
    exponent, mantissa = (codes >> 1) & 3, codes & 1
    twice = torch.where(exponent == 0, mantissa, (2 + mantissa) << (exponent - 1).clamp(min=0))
    sign = 1.0 - 2.0 * (codes >> 3).to(torch.float32)  # float: code 8 is -0.0, as in the table
    scale = torch.exp2(scales.to(torch.int32) - SCALE_BIAS - 1).to(torch.float32)[..., None, None]
    return (sign * twice.to(torch.float32) * scale).to(dtype).flatten(-3)


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One fused kernel on GPUs (torch.compile: lookup, scale and cast in one pass, no index tensors in memory)."""
    if blocks.device.type != "cuda":
        return _dequantize(blocks, scales, dtype)
    if "dequantize" not in _COMPILED:
        _COMPILED["dequantize"] = torch.compile(_dequantize, dynamic=False)
    return _COMPILED["dequantize"](blocks, scales, dtype)


# The last weights each projection dequantized in a forward recomputed inside backward (gradient checkpointing),
# for the backward of the same layer that follows at once: it then needs no second dequantization. Keyed by
# projection, tagged with the layer; a layer drops every other layer's weights before it dequantizes, so one
# layer's weights at most are held beyond their use. The first forward keeps nothing: its weights would stay
# alive through the later layers and the loss (120b: 6.4 GB at the step's peak, measured with
# bench/memory_peak.py) and the backward recomputes them anyway (without checkpointing: dequantizes them again).
_LAST_FORWARD: dict[str, tuple[int, torch.Tensor, torch.Tensor]] = {}  # slot -> (layer, blocks, weights)


def _drop_held_weights(layer: int, slot: str) -> None:
    """Before `layer` dequantizes `slot`: what other layers hold is stale, and so is this slot's own entry."""
    for key in [k for k, (owner, _, _) in _LAST_FORWARD.items() if owner != layer or k == slot]:
        del _LAST_FORWARD[key]


class _PackedGroupedMM(torch.autograd.Function):
    """rows @ W per expert, W dequantized from MXFP4 here and (unless just done for this layer) in backward; only
    the packed blocks are kept for backward."""

    @staticmethod
    def forward(ctx, rows, blocks, scales, offsets, slot: str, layer: int):
        from transformers.integrations.moe import _grouped_mm

        ctx.save_for_backward(blocks, scales, offsets)
        ctx.slot = slot
        _drop_held_weights(layer, slot)
        weight = dequantize(blocks, scales, rows.dtype)  # [E, out, in]
        if rows.requires_grad and torch._C._current_graph_task_id() != -1:  # recomputed inside backward
            _LAST_FORWARD[slot] = (layer, blocks, weight)
        return _grouped_mm(rows, weight.transpose(1, 2), offs=offsets)

    @staticmethod
    def backward(ctx, grad):
        from transformers.integrations.moe import _grouped_mm

        blocks, scales, offsets = ctx.saved_tensors
        cached = _LAST_FORWARD.pop(ctx.slot, None)
        if cached is not None and cached[1].data_ptr() == blocks.data_ptr() and cached[2].dtype == grad.dtype:
            weight = cached[2]
        else:
            weight = dequantize(blocks, scales, grad.dtype)  # [E, out, in]: grad_rows = grad @ W^T
        return _grouped_mm(grad.contiguous(), weight, offs=offsets), None, None, None, None, None


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, out, in] float -> ([E, out, in/32, 16] uint8 blocks, [E, out, in/32] uint8 scales), the inverse of
    `dequantize` up to rounding: per 32 values the smallest power-of-two scale that fits the largest |value| in e2m1's
    range (6), then round to the nearest e2m1 value. One expert at a time (the search holds 8 candidates a value)."""
    table = torch.tensor(FP4_VALUES[:8], device=weight.device)
    blocks, scales = [], []
    for expert in weight:
        o, i = expert.shape
        groups = expert.reshape(o, i // 32, 32)
        amax = groups.abs().amax(-1, keepdim=True).clamp_min(1e-12)
        exponent = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
        scaled = groups / torch.exp2(exponent)
        idx = (scaled.abs().unsqueeze(-1) - table).abs().argmin(-1)
        idx = idx + 8 * (scaled < 0).long() * (idx > 0).long()
        nibbles = idx.to(torch.uint8)
        blocks.append(nibbles[..., 0::2] | (nibbles[..., 1::2] << 4))
        scales.append((exponent.squeeze(-1) + SCALE_BIAS).to(torch.uint8))
    return torch.stack(blocks).contiguous(), torch.stack(scales).contiguous()


RANK_ALIGNMENT = 8  # elements: 16 bytes of bf16, the grouped GEMM's stride alignment


def _lora_beside(rows, offsets, factors):
    """scaling * (rows @ A_e) @ B_e per expert: the LoRA part of rows @ (W + scaling * A @ B), as two grouped GEMMs
    of rank width (autograd saves rows and the rank-wide middle, never a weight-sized tensor)."""
    from transformers.integrations.moe import _grouped_mm

    lhs, rhs, scaling = factors  # [E, in, r], [E, r, out] (peft's ParamWrapper.get_delta_factors)
    # CUDA's grouped GEMM needs each row 16-byte aligned: a rank that is not a multiple of 8 (bf16) is padded
    # with zero columns of A and zero rows of B, which add nothing (and receive no gradient that reaches A or B)
    pad = -lhs.shape[-1] % RANK_ALIGNMENT
    lhs, rhs = nn.functional.pad(lhs, (0, pad)), nn.functional.pad(rhs, (0, 0, 0, pad))
    middle = _grouped_mm(rows, lhs.to(rows.dtype).contiguous(), offs=offsets)
    return _grouped_mm(middle, rhs.to(rows.dtype).contiguous(), offs=offsets) * scaling


class Mxfp4Experts(nn.Module):
    """Drop-in for transformers' GptOssExperts with frozen MXFP4 weights (buffers named as in the checkpoint)."""

    def __init__(self, config, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        experts, hidden, inter = config.num_local_experts, config.hidden_size, config.intermediate_size
        # transformers releases that predate the config fields hard-code gpt-oss's values (1.702, 7.0) in GptOssExperts
        alpha, limit = getattr(config, "swiglu_alpha", 1.702), getattr(config, "swiglu_limit", 7.0)
        self.num_experts, self.alpha, self.limit = experts, alpha, limit
        shapes = dict(zip(PROJECTIONS, [(experts, 2 * inter, hidden), (experts, hidden, inter)], strict=True))
        # transformers' layout of each projection, [E, in, out]: what peft's target_parameters sees
        self.parameter_shapes = {name: (e, inp, out) for name, (e, out, inp) in shapes.items()}
        # set by kernels/mxfp4_lora.py's wrapper for the length of one forward: projection -> (A, B, scaling)
        self.lora_factors: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}
        self.merge_report: dict[str, dict[str, float]] = {}  # what merge_delta measured, per projection
        self.is_transposed = False  # set from the experts module this one replaces (empty_packed_model)
        for name, (e, out, inp) in shapes.items():
            self.register_buffer(f"{name}_blocks", torch.zeros(e, out, inp // 32, 16, dtype=torch.uint8))
            self.register_buffer(f"{name}_scales", torch.zeros(e, out, inp // 32, dtype=torch.uint8))
            self.register_parameter(f"{name}_bias", nn.Parameter(torch.zeros(e, out, dtype=dtype), False))

    def forward(self, hidden_states, router_indices, routing_weights):
        from .moe import fused_experts

        layer = id(self)

        def projection(name: str, slot: str):
            def run(rows, offsets):
                blocks, scales = getattr(self, f"{name}_blocks"), getattr(self, f"{name}_scales")
                out = _PackedGroupedMM.apply(rows, blocks, scales, offsets, slot, layer)
                factors = self.lora_factors.get(name)
                return out if factors is None else out + _lora_beside(rows, offsets, factors)

            return run

        gate_up, down = projection("gate_up_proj", "gate_up"), projection("down_proj", "down")
        return fused_experts(self, hidden_states, router_indices, routing_weights, gate_up, down)

    def dequantized(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """transformers' parameter layout [E, in, out] of `gate_up_proj` or `down_proj`."""
        blocks, scales = getattr(self, f"{name}_blocks"), getattr(self, f"{name}_scales")
        return dequantize(blocks, scales, dtype).transpose(1, 2)

    @torch.no_grad()
    def merge_delta(self, name: str, delta: torch.Tensor) -> dict[str, float]:
        """Add `delta` ([E, in, out], transformers' layout) to projection `name` and requantize it to MXFP4. Returns
        what the requantization made of the delta d: `kept` = <Q(W + d) - W, d> / |d|^2, the share of d the merged
        weights carry (1: all of it, 0: rounded away), and `error` = |Q(W + d) - (W + d)| / |d| (norms over the
        projection)."""
        blocks, scales = getattr(self, f"{name}_blocks"), getattr(self, f"{name}_scales")
        base = dequantize(blocks, scales, torch.float32)  # [E, out, in]
        wanted = base + delta.to(base.device, torch.float32).transpose(1, 2)
        new_blocks, new_scales = quantize(wanted)
        blocks.copy_(new_blocks)
        scales.copy_(new_scales)
        merged = dequantize(blocks, scales, torch.float32)
        intended = wanted - base
        square = float(intended.square().sum()) or 1.0
        kept = float(((merged - base) * intended).sum()) / square
        size = square**0.5 / (float(base.norm()) or 1.0)  # |d| / |W|
        return {"kept": kept, "error": float((merged - wanted).norm()) / square**0.5, "size": size}


def _rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' GptOssRMSNorm.forward term for term: statistics and the weight applied in fp32, the result in
    the input dtype."""
    dtype = hidden_states.dtype
    hidden = hidden_states.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return (weight * hidden).to(dtype)


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """One fused kernel forward and one backward on GPUs (torch.compile; the shape is specialised until a second
    one is seen, then dynamic); eager elsewhere. Eager on a GPU it is ~7 kernels forward (the fp32 copy, pow,
    mean, two fp32 muls, the cast back) and ~12 backward, each a full pass over [tokens, hidden] in fp32: on the
    120b step (16,384 tokens, 145 norm forwards and 72 backwards with recomputation) an estimated ~150-180 ms of
    its 2.2 s (bench/results/train_throughput_1gpu_profile_120b.json: fp32 muls, pow, mean, sums, casts)."""
    if hidden_states.device.type != "cuda":
        return _rms_norm(hidden_states, weight, eps)
    if "rms_norm" not in _COMPILED:
        _COMPILED["rms_norm"] = torch.compile(_rms_norm)
    return _COMPILED["rms_norm"](hidden_states, weight, eps)


class FusedRMSNorm(nn.Module):
    """Drop-in for transformers' GptOssRMSNorm (the same `weight` parameter and state-dict key, the same
    arithmetic), run through `rms_norm`."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight: nn.Parameter = cast(nn.Parameter, norm.weight)
        self.variance_epsilon = float(cast(float, norm.variance_epsilon))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


def empty_packed_model(config, dtype: torch.dtype, device: str | torch.device, fused_norms: bool = True):
    """gpt-oss with packed experts, built on the meta device and given uninitialised storage on `device` (the
    caller loads or fills the weights); the rotary frequencies, which no checkpoint holds, are computed here.
    `fused_norms`: the RMSNorms as `FusedRMSNorm` (False: transformers' eager ones, for the bench's comparison)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        for layer in model.model.layers:
            packed = Mxfp4Experts(model.config, dtype)
            # transformers' flag that its expert weights are [E, in, out] (peft lays out an expert LoRA by it)
            packed.is_transposed = getattr(layer.mlp.experts, "is_transposed", False)
            layer.mlp.experts = packed
            if fused_norms:
                layer.input_layernorm = FusedRMSNorm(layer.input_layernorm)
                layer.post_attention_layernorm = FusedRMSNorm(layer.post_attention_layernorm)
        if fused_norms:
            model.model.norm = FusedRMSNorm(model.model.norm)
    model.to_empty(device=device)
    with torch.device(device):  # non-persistent buffers: `to_empty` left them uninitialised
        model.model.rotary_emb = type(model.model.rotary_emb)(config=model.config)
    return model


def compile_packed_layers(model, **compile_options: Any) -> int:
    """torch.compile the parts of each decoder layer of a packed model that are not the packed experts: its attention
    block (the LoRA-wrapped q/k/v/o projections, rotary, flex attention with the sinks) and its router; returns how
    many layers. The packed experts keep their own path (a custom autograd function that dequantizes per layer and
    keeps a recomputed forward's weights for the backward, with compiled glue kernels), and so do the RMSNorms (one
    compiled kernel each) and the residual adds. The layer itself stays eager, so recomputation (transformers'
    checkpoint around the layer's forward) wraps the compiled parts as it wraps eager ones and replays them in the
    backward; compiling the whole layer would put that checkpoint, and a graph break at the experts, inside the
    compiled region. Each part compiles once per layer type (sliding or full attention) and is reused by every
    layer; fixed-width packed micro-batches keep the shapes static. `compile_options` go to torch.compile (tests:
    another backend)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = base.model.layers
    for layer in layers:
        layer.self_attn.compile(**compile_options)
        layer.mlp.router.compile(**compile_options)
    return len(layers)


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        return sorted({path / f for f in json.loads(index.read_text())["weight_map"].values()})
    return sorted(path.glob("*.safetensors"))


def load_packed(path: str, dtype: torch.dtype, device: str | torch.device, attn: str):
    """A gpt-oss MXFP4 checkpoint with its experts kept packed: the model is built on the meta device and every
    tensor streams from the safetensors files straight to `device` (host memory: one tensor at a time)."""
    from safetensors import safe_open
    from transformers import AutoConfig

    directory = Path(path)
    config = AutoConfig.from_pretrained(directory)
    quantization = config.quantization_config
    del config.quantization_config
    config._attn_implementation = attn
    model = empty_packed_model(config, dtype, device)
    expected = dict(model.state_dict(keep_vars=True))
    seen: set[str] = set()
    for file in checkpoint_files(directory):
        with safe_open(str(file), framework="pt", device=str(device)) as tensors:
            for key in tensors.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if key not in expected:
                    raise ValueError(f"{file.name}: tensor {key} has no place in a gpt-oss model with MXFP4 experts")
                target = expected[key]
                value = tensors.get_tensor(key)
                with torch.no_grad():
                    target.copy_(value)  # casts to the model dtype; uint8 blocks stay uint8
                seen.add(key)
    missing = sorted(set(expected) - seen - _tied(model))
    if missing:
        raise ValueError(f"{path}: the checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    model.config.quantization_config = quantization  # kept: the merged model is saved in the same MXFP4 form
    return model


def _tied(model) -> set[str]:
    return {"lm_head.weight"} if model.config.tie_word_embeddings else set()
