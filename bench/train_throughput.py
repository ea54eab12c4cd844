"""Training throughput of the toolkit's path against the published recipe, side by side, same model, same data.

Builds gpt-oss-20b's exact shape with random weights on the GPU (no hub), applies the entrypoint's LoRA,
and trains with the entrypoint's own SFTConfig, trainer, collator, packing and loss:
  recipe   eager attention, one row per micro-batch, gradient checkpointing, HF loss (the Databricks settings)
  toolkit  flex attention, packed token-budget micro-batches with document masks, chunked loss on trained tokens
Synthetic rows have log-normal token lengths (median ~1000, capped at max length) with the first ~35% of each
row as an untrained prompt. Before timing, a correctness gate compares the fast path's loss and LoRA
gradients with the recipe path's on the same rows. Prints a table; writes bench/results/train_throughput.json.

  python bench/train_throughput.py                 # one GPU
  torchrun --nproc-per-node 2 bench/train_throughput.py --variants toolkit   # DDP scaling
  python bench/train_throughput.py --tiny          # CPU smoke test of this script
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "entrypoints"))  # the training package, from a checkout
sys.path.insert(0, str(REPO))

import torch
from toolkit_train.data import IGNORE_INDEX
from toolkit_train.settings import TrainSettings

PEAK_BF16_FLOPS = 790e12  # measured on this H200 (8192^3 bf16 matmul, random data)
ACTIVE_PARAMS = {"20b": 3.6e9, "120b": 5.1e9}
FAST_ATTENTION = "flex_attention"  # --tiny runs on CPU, where flex cannot do gpt-oss's sinks: eager there
MEMORY_AT_PEAK: dict | None = None  # --memory-peak: what is alive at the last step's peak (bench/memory_peak.py)


def gpt_oss_config(tiny: bool, layers: int | None = None, size: str = "20b"):
    from transformers import GptOssConfig

    if tiny:
        shape = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                     vocab_size=1024, sliding_window=32)  # fmt: skip
    else:  # gpt-oss-20b
        shape = dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64,
                     num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
                     vocab_size=201088, sliding_window=128)  # fmt: skip
    if size == "120b" and not tiny:
        shape.update(num_hidden_layers=36, num_local_experts=128)
    if layers:
        shape["num_hidden_layers"] = layers
    n = shape["num_hidden_layers"]
    return GptOssConfig(
        **shape,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)],
        max_position_embeddings=131072,
        tie_word_embeddings=False,
    )


def build_model(config, device, dtype, attn, experts="toolkit_fused"):
    from toolkit_train.kernels.moe import register
    from transformers import GptOssForCausalLM

    register()
    config._attn_implementation = attn
    config._experts_implementation = experts
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in dtype: fp32 first would need 2x the memory (20b: 84 GB) for a moment
    try:
        with torch.device(device):
            model = GptOssForCausalLM(config).to(dtype)
    finally:
        torch.set_default_dtype(default)
    model.config.use_cache = False
    return model


def build_packed_model(config, device, attn, fused_norms: bool = True):
    """gpt-oss with MXFP4 experts kept packed (model.experts: mxfp4), random weights built on the GPU: blocks are
    random e2m1 codes, scales 2^-8..2^-6 (weights of RMS ~0.01-0.05, like the released checkpoints).
    `fused_norms=False`: transformers' eager RMSNorms, as before #48."""
    from toolkit_train.kernels.mxfp4 import PROJECTIONS, Mxfp4Experts, empty_packed_model

    config._attn_implementation = attn
    model = empty_packed_model(config, torch.bfloat16, device, fused_norms=fused_norms)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.fill_(1.0)
            else:
                parameter.normal_(0.0, 0.02, generator=generator)
        for module in model.modules():
            if isinstance(module, Mxfp4Experts):
                for projection in PROJECTIONS:
                    getattr(module, f"{projection}_blocks").random_(0, 256, generator=generator)
                    getattr(module, f"{projection}_scales").random_(119, 122, generator=generator)
    model.config.use_cache = False
    return model


def unpacked_copy(packed, config, device, dtype):
    """The same model with its experts dequantized into transformers' bf16 experts (model.experts: bf16)."""
    from toolkit_train.kernels.mxfp4 import Mxfp4Experts

    model = build_model(config, device, dtype, FAST_ATTENTION)
    state = {k: v for k, v in packed.state_dict().items() if "_blocks" not in k and "_scales" not in k}
    model.load_state_dict(state, strict=False)
    for mine, theirs in zip(model.model.layers, packed.model.layers, strict=True):
        experts = theirs.mlp.experts
        assert isinstance(experts, Mxfp4Experts)
        with torch.no_grad():
            mine.mlp.experts.gate_up_proj.copy_(experts.dequantized("gate_up_proj", dtype))
            mine.mlp.experts.down_proj.copy_(experts.dequantized("down_proj", dtype))
    return model.to(dtype)


def fp32_gate_rows(config) -> list:
    """The mxfp4 gates' rows, with TF32 off: their fp32 bounds are for true fp32 matmuls."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return synthetic_rows(3, 600, config.vocab_size, seed=1)


def packed_gate(config, device) -> dict:
    """model.experts: mxfp4 against the same weights dequantized at load (bf16 experts), fast path, LoRA gradients:
    fp32 (TF32 off) must agree to rounding; bf16 is reported."""
    from toolkit_train.run.model import add_lora
    from toolkit_train.settings import LoraSettings

    rows = fp32_gate_rows(config)
    out: dict = {}
    # attention LoRA, then expert LoRA too (packed experts: beside the dequantized GEMMs, kernels/mxfp4_lora.py),
    # then the experts at rank 4 (lora.expert_r: padded to the grouped GEMM's alignment)
    cases = (("", [], None), ("experts_", EXPERT_PARAMETERS, None), ("experts_r4_", EXPERT_PARAMETERS, 4))
    for prefix, targets, expert_r in cases:
        for dtype in (torch.float32, torch.bfloat16):
            results = []
            packed = build_packed_model(config, device, FAST_ATTENTION).to(dtype)
            for model in (packed, unpacked_copy(packed, config, device, dtype)):
                model = add_lora(model, LoraSettings(dropout=0.0, target_parameters=targets, expert_r=expert_r), seed=0)
                torch.manual_seed(5)
                for name, param in model.named_parameters():
                    if "lora_B" in name:
                        torch.nn.init.normal_(param, std=0.02)
                results.append(_fast_grads(model, rows, device))
            (loss, grads), (ref_loss, ref_grads) = results
            key = prefix + str(dtype).split(".")[1]
            out[f"{key}_loss_rel_diff"] = abs(loss - ref_loss) / ref_loss
            out[f"{key}_grad_rel_err"] = float((grads - ref_grads).norm() / ref_grads.norm())
            del packed
    out.update(lora_input_cast_gate(config, device, rows))
    if device != "cpu":  # compiled attention blocks and routers on the packed path (training.compile_layers on GPU)
        out.update(compiled_packed_gate(config, device, rows))
    out["passed"] = (
        out["lora_input_cast_passed"]
        and out.get("compiled_passed", True)
        and all(out[f"{p}float32_grad_rel_err"] < 1e-4 and out[f"{p}float32_loss_rel_diff"] < 1e-5 for p, _, _ in cases)
    )
    return out


def compiled_packed_gate(config, device, rows) -> dict:
    """The packed path with its attention blocks and routers compiled (kernels/mxfp4.py: compile_packed_layers,
    what training.compile_layers does with model.experts: mxfp4), with recomputation (transformers' non-reentrant
    checkpoint around each layer, as 120b trains: the recomputed forward replays the compiled parts, and the packed
    experts' backward reuses the weights it dequantized) and without, against the same packed model eager without
    recomputation. fp32 (TF32 off): loss within 1e-5 and LoRA gradients within 1e-4 relative (this gate's fp32
    bounds). Training's precision (bf16 base, fp32 adapters, bf16 autocast), against the eager fp32 result: within
    1.5x the eager path's own error at that precision (floors: 1e-4 for the loss, 1e-3 for the gradients; the bound
    the bf16-expert path's compiled gate states). Also the compiler's graph and graph-break counts."""
    from toolkit_train.kernels.mxfp4 import compile_packed_layers
    from toolkit_train.run.model import add_lora
    from toolkit_train.settings import LoraSettings

    def run(compiled: bool, checkpointing: bool, autocast: bool):
        model = build_packed_model(config, device, FAST_ATTENTION)
        model = add_lora(model if autocast else model.to(torch.float32), LoraSettings(dropout=0.0), seed=0)
        torch.manual_seed(5)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.02)
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if compiled:
            compile_packed_layers(model)
        started = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
            result = _fast_grads(model, rows, device)
        print(
            f"compiled gate: compiled={compiled} gc={checkpointing} autocast={autocast} loss={result[0]:.6f} "
            f"in {time.perf_counter() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        del model
        gc.collect()  # the first run of this gate ran out of memory on an 80 GB H100: free each model (and trainer)
        torch.cuda.empty_cache()
        return result

    gc.collect()
    torch.cuda.empty_cache()
    before = dynamo_counts()
    ref_loss, ref = run(compiled=False, checkpointing=False, autocast=False)
    runs = {
        "eager_bf16_autocast": run(compiled=False, checkpointing=False, autocast=True),
        "compiled_gc_float32": run(compiled=True, checkpointing=True, autocast=False),
        "compiled_float32": run(compiled=True, checkpointing=False, autocast=False),
        "compiled_gc_bf16_autocast": run(compiled=True, checkpointing=True, autocast=True),
    }
    after = dynamo_counts()
    out: dict = {"layers": config.num_hidden_layers, "num_local_experts": config.num_local_experts,
                 "eager_float32_loss": ref_loss}  # fmt: skip
    for key, (loss, grads) in runs.items():
        out[f"{key}_loss"] = loss
        out[f"{key}_loss_rel_diff"] = abs(loss - ref_loss) / ref_loss
        out[f"{key}_grad_rel_err"] = float((grads - ref).norm() / ref.norm())
    # compiled against eager at training's precision, directly (the entrypoint's step-1 loss gap is this comparison)
    (loss, grads), (eager_loss, eager) = runs["compiled_gc_bf16_autocast"], runs["eager_bf16_autocast"]
    out["compiled_gc_vs_eager_bf16_autocast_loss_diff"] = loss - eager_loss
    out["compiled_gc_vs_eager_bf16_autocast_grad_rel_err"] = float((grads - eager).norm() / eager.norm())
    out["compiled_graphs"] = after["unique_graphs"] - before["unique_graphs"]
    out["compiled_graph_breaks"] = after["graph_breaks"] - before["graph_breaks"]
    out["compiled_graph_break_reasons"] = after["graph_break_reasons"]
    bf16_loss_bound = 1.5 * max(out["eager_bf16_autocast_loss_rel_diff"], 1e-4)
    bf16_grad_bound = 1.5 * max(out["eager_bf16_autocast_grad_rel_err"], 1e-3)
    out["compiled_passed"] = (
        out["compiled_graphs"] > 0
        and all(out[f"{k}_loss_rel_diff"] < 1e-5 and out[f"{k}_grad_rel_err"] < 1e-4
                for k in ("compiled_gc_float32", "compiled_float32"))
        and out["compiled_gc_bf16_autocast_loss_rel_diff"] <= bf16_loss_bound
        and out["compiled_gc_bf16_autocast_grad_rel_err"] <= bf16_grad_bound
    )  # fmt: skip
    return out


def dynamo_counts() -> dict:
    """What torch.compile has done in this process so far: graphs captured, graph breaks and their reasons."""
    from torch._dynamo.utils import counters

    breaks = counters["graph_break"]
    return {"unique_graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(breaks.values()),
            "graph_break_reasons": {reason[:200]: n for reason, n in list(breaks.items())[:8]}}  # fmt: skip


def _peft_cast_again(model) -> None:
    """Undo toolkit_train.run.model.skip_input_casts_under_autocast: peft's own input cast, as before the lever."""
    for module in model.modules():
        vars(module).pop("_cast_input_dtype", None)


def lora_input_cast_gate(config, device, rows) -> dict:
    """Training's precision (bf16 base, fp32 adapters, bf16 autocast): loss and LoRA gradients with peft's input cast
    skipped (toolkit_train.run.model.skip_input_casts_under_autocast) against peft's own cast, run twice for the spread
    of the kernels' own nondeterminism; passes when the skip moves them no more than that (bitwise expected)."""
    from toolkit_train.run.model import add_lora
    from toolkit_train.settings import LoraSettings

    results = []
    for skip in (False, False, True):
        model = add_lora(build_packed_model(config, device, FAST_ATTENTION), LoraSettings(dropout=0.0), seed=0)
        if not skip:
            _peft_cast_again(model)
        torch.manual_seed(5)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.02)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            results.append(_fast_grads(model, rows, device))
        del model
    (loss, grads), (loss_again, grads_again), (skip_loss, skip_grads) = results
    spread = float((grads_again - grads).norm() / grads.norm())
    error = float((skip_grads - grads).norm() / grads.norm())
    return {"lora_input_cast_spread_grad_rel_err": spread, "lora_input_cast_skip_grad_rel_err": error,
            "lora_input_cast_skip_loss_diff": abs(skip_loss - loss),
            "lora_input_cast_passed": error <= max(10 * spread, 1e-6) and abs(skip_loss - loss) <= max(
                10 * abs(loss_again - loss), 1e-6)}  # fmt: skip


def tokenizer():
    """Rows are pre-tokenized; the trainer only needs a tokenizer object (pad id): the tiny harmony one."""
    from toolkit_train.builtin.tiny_model import build_tokenizer

    return build_tokenizer()


def _row_lengths(generator, n: int, max_length: int) -> list[int]:
    """Log-normal row lengths, median ~1,000 tokens (Multilingual-Thinking-like), clipped to [64, max_length]."""
    return torch.exp(torch.randn(n, generator=generator) * 0.6 + math.log(1000)).clamp(64, max_length).long().tolist()


def row_lengths(n: int, max_length: int, seed: int = 0) -> list[int]:
    """The lengths `synthetic_rows` draws (its first draw from the same seed)."""
    return _row_lengths(torch.Generator().manual_seed(seed), n, max_length)


def synthetic_rows(n: int, max_length: int, vocab: int, seed: int = 0) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for length in _row_lengths(generator, n, max_length):
        ids = torch.randint(0, vocab, (length,), generator=generator).tolist()
        prompt = int(0.35 * length)
        rows.append({"input_ids": ids, "labels": [IGNORE_INDEX] * prompt + ids[prompt:]})
    return rows


def settings_for(variant: str, max_length: int, budget: int, checkpointing: bool, experts: str) -> TrainSettings:
    recipe = variant == "recipe"
    return TrainSettings.model_validate(
        {
            "model": {
                "id": "openai/gpt-oss-20b",
                "attn_implementation": "eager" if recipe else FAST_ATTENTION,
                "experts_implementation": experts,
            },
            "data": {"source": "synthetic", "max_length": max_length},
            "lora": {"r": 8, "alpha": 16, "dropout": 0.0},
            "training": {
                "per_device_batch_size": 1,
                "gradient_checkpointing": checkpointing,
                "packing": not recipe,
                "tokens_per_micro_batch": budget,
                "save_steps": 0,
                "learning_rate": 2e-4,
                "warmup_ratio": 0.0,
                "logging_steps": 1000,
            },
        }
    )


def make_trainer(model, settings: TrainSettings, rows: list[dict], steps: int, out: Path):
    """The entrypoint's trainer (toolkit_train.trainers.build_trainer: packing, collator, trainer class), with a
    clock, token counters and the memory probe around its steps."""
    import datasets
    from toolkit_train.layout import Paths
    from toolkit_train.run.trainer import trainer_args
    from toolkit_train.trainers import build_trainer
    from transformers import TrainerCallback

    paths = Paths(root=out, model_dir=out / "model", checkpoints=out / "ckpt", train_channel=out, output_data=out)
    args = trainer_args(settings, paths)
    args.max_steps, args.report_to, args.save_strategy = steps, [], "no"
    if settings.training.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
    stamps: list[float] = []
    tokens: list[int] = []
    rows_seen: list[int] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())

    def counting(base: type) -> type:
        class Counting(base):  # type: ignore[misc, valid-type]
            def training_step(self, model, inputs, num_items_in_batch=None):
                real = inputs["document_ids"] >= 0 if "document_ids" in inputs else inputs["input_ids"] >= 0
                tokens.append(int(real.sum()))
                ids = inputs.get("document_ids")
                rows_seen.append(len(set(ids[ids >= 0].tolist())) if ids is not None else len(inputs["input_ids"]))
                return super().training_step(model, inputs, num_items_in_batch)

        return Counting

    class MemoryAtPeak(TrainerCallback):
        before = 0

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == steps - 1:
                self.before = memory_peak.start()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == steps and MEMORY_AT_PEAK is not None:
                MEMORY_AT_PEAK.update(memory_peak.stop(self.before))

    import memory_peak

    callbacks = [Clock(), *([MemoryAtPeak()] if MEMORY_AT_PEAK is not None else [])]
    dataset = datasets.Dataset.from_list(rows)
    trainer = build_trainer(settings, paths, model, tokenizer(), dataset, callbacks=callbacks, args=args,
                            subclass=counting)  # fmt: skip
    return trainer, stamps, tokens, rows_seen


def measure(model, variant, rows, steps, warmup, max_length, budget, checkpointing, out, experts, size="20b"):
    settings = settings_for(variant, max_length, budget, checkpointing, experts)
    model.config._attn_implementation = settings.model.attn_implementation
    model.config._experts_implementation = settings.model.experts_implementation
    trainer, stamps, tokens, rows_seen = make_trainer(model, settings, rows, warmup + steps, out)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    profiler = _profiler(trainer, warmup, steps)
    try:
        with profiler or contextlib.nullcontext():
            trainer.train()
    except torch.OutOfMemoryError:
        return {"variant": variant, "gc": checkpointing, "tokens_per_step": budget if variant != "recipe" else 1,
                "error": "out of memory"}  # fmt: skip
    finally:
        del trainer
    seconds = stamps[-1] - stamps[warmup - 1] if warmup else stamps[-1] - start
    trained = sum(tokens[warmup : warmup + steps])
    rate = trained / seconds
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return {
        "variant": variant,
        "attention": settings.model.attn_implementation,
        "packing": settings.training.packing,
        "gc": checkpointing,
        "max_length": max_length,
        "tokens_per_micro_batch": budget if settings.training.packing else "1 row",
        "tokens_per_s": round(rate * world),
        "tokens_per_s_per_gpu": round(rate),
        "step_s": round(seconds / steps, 3),
        "step_s_each": [round(b - a, 3) for a, b in zip([start, *stamps], stamps, strict=False)],  # warm-up first
        "rows_per_optimizer_step": round(sum(rows_seen[warmup : warmup + steps]) / steps * world, 1),
        "experts": experts,
        "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 1) if torch.cuda.is_available() else 0,
        # what the allocator held (cached and fragmented blocks too): what decides whether a smaller GPU fits it
        "peak_reserved_gb": round(torch.cuda.max_memory_reserved() / 1e9, 1) if torch.cuda.is_available() else 0,
        # the CUDA context, kernels and libraries' workspaces: the rest of what a GPU must have
        "outside_allocator_gb": round(outside_allocator_bytes() / 1e9, 1) if torch.cuda.is_available() else 0,
        **({"memory_at_peak": MEMORY_AT_PEAK} if MEMORY_AT_PEAK else {}),
        **({"profile": profile_row(profiler, stamps, lora_ranks(model))} if profiler else {}),
        "mfu": round(rate * flops_per_token(checkpointing, size, max_length) / PEAK_BF16_FLOPS, 3),
    }


# --profile: GPU time of the measured steps by kernel class (bench/kernel_profile.py: torch.profiler, kernels linked
# to the ops that launched them; the warm-up and compile steps are skipped).
PROFILE = False


def _profiler(trainer, warmup: int, steps: int):
    if not PROFILE or not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile, schedule
    from transformers import TrainerCallback

    clean = 1 if steps >= 3 else 0  # the first measured step runs with no profiler: its wall time is the clean one
    active = max(steps - 1 - clean, 1)
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                   schedule=schedule(wait=warmup + clean, warmup=1, active=active))  # fmt: skip

    class Step(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            prof.step()

    trainer.add_callback(Step())
    prof.steps_profiled = active  # type: ignore[attr-defined]
    prof.clean_step = warmup if clean else None  # type: ignore[attr-defined]  # its index in the step clock
    return prof


def profile_row(prof, stamps: list[float], lora_ranks: tuple[int, ...]) -> dict:
    """The profiled steps' kernel classes; their wall time from the step clock (the profiler's own overhead in it)."""
    from kernel_profile import kernel_profile

    steps, clean = prof.steps_profiled, prof.clean_step
    try:
        row = kernel_profile(prof, steps, round((stamps[-1] - stamps[-1 - steps]) / steps, 3), lora_ranks)
        if clean is not None:
            row["step_s_unprofiled"] = round(stamps[clean] - stamps[clean - 1], 3)
        return row
    except Exception as error:  # the throughput row must survive a profiler it cannot read
        return {"error": f"{type(error).__name__}: {error}"}


def lora_ranks(model) -> tuple[int, ...]:
    config = getattr(model, "peft_config", {}).get("default")
    return (config.r,) if config is not None else ()


def outside_allocator_bytes(device=None) -> int:
    """What the process holds on the GPU outside PyTorch's allocator: the CUDA context, kernels, workspaces."""
    free, total = torch.cuda.mem_get_info(device)
    return total - free - torch.cuda.memory_reserved(device)


def flops_per_token(checkpointing: bool, size: str = "20b", max_length: int = 2048) -> float:
    """Matrix FLOPs per trained token, counted as done: on the active parameters forward 2N, backward to the inputs
    2N (the base is frozen: no weight gradients; LoRA's are negligible), and another forward 2N when activations
    are recomputed; plus attention's own (`attention_flops_per_token`)."""
    dense = (4 + (2 if checkpointing else 0)) * ACTIVE_PARAMS[size]
    return dense + attention_flops_per_token(checkpointing, size, max_length)


def attention_flops_per_token(checkpointing: bool, size: str, max_length: int) -> float:
    """QK^T and PV: 4 x heads x head_dim FLOPs per attended key in the forward, twice that in the backward (to q, k
    and v), once more when recomputed. A token attends to every earlier token of its own row in full-attention
    layers and to at most the window's in sliding ones (the packed masks; the recipe's unpacked rows the same),
    averaged over the benchmark's rows."""
    config = gpt_oss_config(False, size=size)
    window = config.sliding_window
    lengths = row_lengths(1000, max_length)
    full = sum(n * (n + 1) / 2 for n in lengths)
    sliding = sum(min(n, window) * (min(n, window) + 1) / 2 + max(n - window, 0) * window for n in lengths)
    types = config.layer_types
    keys_per_token = (types.count("full_attention") * full + types.count("sliding_attention") * sliding) / sum(lengths)
    forward = 4 * config.num_attention_heads * config.head_dim * keys_per_token
    return forward * (3 + (1 if checkpointing else 0))


def correctness_gate(config, device, max_length):
    """Fast path (flex, packed, chunked loss) vs recipe path (eager, one row per forward) on the same rows.

    Run in fp32 (where the two must agree to rounding) and in bf16; the bf16 tolerance is the recipe's own
    bf16 error against its fp32 result, measured here on the same rows.
    """
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 must mean fp32 for the strict comparison
    torch.backends.cudnn.allow_tf32 = False
    rows = synthetic_rows(3, min(max_length, 600), config.vocab_size, seed=1)
    results: dict = {}
    model = _gate_model(config, device)
    for dtype in (torch.float32, torch.bfloat16):
        model.to(dtype)
        fast_loss, fast = _fast_grads(model, rows, device)
        recipe_loss, recipe = _recipe_grads(model, rows, device, "eager")
        paths = {"fast": (fast_loss, fast), "recipe": (recipe_loss, recipe)}
        if FAST_ATTENTION != "eager":  # the recipe's own path with flex: what the attention kernel alone changes
            paths["recipe_flex"] = _recipe_grads(model, rows, device, FAST_ATTENTION)
        results[str(dtype).split(".")[1]] = paths
    del model
    if device != "cpu":  # the fast path with compiled decoder layers (training.compile_layers on GPU)
        from toolkit_train.run.model import compile_decoder_layers

        for dtype in (torch.float32, torch.bfloat16):
            # A fresh model per dtype: `.to(bf16).to(fp32)` leaves non-persistent buffers (the rotary inv_freq)
            # rounded to bf16, which load_state_dict does not restore -- that, not the compiler, made an earlier
            # version of this gate report bf16-sized fp32 errors for the compiled path.
            model = _gate_model(config, device).to(dtype)
            compile_decoder_layers(model)
            results[str(dtype).split(".")[1]]["fast_compiled"] = _fast_grads(model, rows, device)
            del model
    reference_loss, reference = results["float32"]["recipe"]

    def rel(grads):
        return float((grads - reference).norm() / reference.norm())

    out = {}
    for dtype, paths in results.items():
        for path, (loss, grads) in paths.items():
            out[f"{path}_{dtype}_loss"] = round(loss, 5)
            out[f"{path}_{dtype}_grad_rel_err"] = rel(grads)
    # fp32: packing + chunked loss may change nothing beyond what the attention kernel itself changes
    kernel_err = out.get("recipe_flex_float32_grad_rel_err", 0.0)
    fast_paths = ["fast", "fast_compiled"] if "fast_compiled_float32_loss" in out else ["fast"]
    out["passed"] = all(
        out[f"{path}_float32_grad_rel_err"] < max(1e-3, 1.5 * kernel_err)
        and abs(out[f"{path}_float32_loss"] - reference_loss) / reference_loss < 1e-4
        and out[f"{path}_bfloat16_grad_rel_err"] <= 1.5 * max(out["recipe_bfloat16_grad_rel_err"], 1e-3)
        for path in fast_paths
    )
    return out


def _gate_model(config, device):
    """The gate's model: fixed random weights, LoRA with non-zero B so every adapter gets a gradient."""
    from toolkit_train.run.model import add_lora
    from toolkit_train.settings import LoraSettings

    model = add_lora(build_model(config, device, torch.float32, FAST_ATTENTION), LoraSettings(dropout=0.0), seed=0)
    torch.manual_seed(5)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    return model


def compile_diagnosis(config, device) -> dict:
    """fp32, TF32 off: the fast path's loss and LoRA gradients with compiled decoder layers, with transformers'
    experts and with the fused ones, against the same path uncompiled (each a fresh model, same weights)."""
    from toolkit_train.run.model import compile_decoder_layers

    rows = fp32_gate_rows(config)
    out: dict = {}
    reference = None
    runs = [("eager_layers", "toolkit_fused", False), ("compiled_grouped_mm", "grouped_mm", True),
            ("compiled_fused", "toolkit_fused", True)]  # fmt: skip
    for label, experts, compiled in runs:
        model = _gate_model(config, device)
        if compiled:
            compile_decoder_layers(model)
        model.get_base_model().config._experts_implementation = experts
        loss, grads = _fast_grads(model, rows, device, experts)
        if reference is None:
            reference = (loss, grads)
        out[f"{label}_loss"] = loss
        out[f"{label}_grad_rel_err"] = float((grads - reference[1]).norm() / reference[1].norm())
        del model
    return out


def fp8_gate(config, device) -> dict:
    """FP8 frozen experts (toolkit_train/fp8.py) against the fp32 fast path (TF32 off), same rows, 2 layers of the
    20b shape: the loss and LoRA gradients of the bf16 fast path and of the same with FP8 experts, eager and with
    compiled decoder layers (as the entrypoint would run it). FP8 is not exact: the bound is its error beside bf16's
    own (passed: FP8's gradient error at most twice bf16's, or 5% where bf16's is smaller, eager and compiled; the
    loss within 1%)."""
    from fp8 import attach_fp8_experts
    from toolkit_train.run.model import compile_decoder_layers

    rows = fp32_gate_rows(config)
    reference_loss, reference = _fast_grads(_gate_model(config, device), rows, device)
    out: dict = {"fp32_loss": round(reference_loss, 5)}
    grads: dict = {}
    for label, use_fp8, compiled in [("bf16", False, False), ("fp8", True, False), ("fp8_compiled", True, True)]:
        model = _gate_model(config, device).to(torch.bfloat16)
        if use_fp8:
            attach_fp8_experts(model)
        if compiled:
            compile_decoder_layers(model)
        loss, grads[label] = _fast_grads(model, rows, device)
        out[f"{label}_loss_rel_err"] = abs(loss - reference_loss) / reference_loss
        out[f"{label}_grad_rel_err"] = float((grads[label] - reference).norm() / reference.norm())
        del model
    out["fp8_compiled_vs_eager_grad_rel"] = float((grads["fp8_compiled"] - grads["fp8"]).norm() / grads["fp8"].norm())
    out["passed"] = (
        out["fp8_grad_rel_err"] <= max(2 * out["bf16_grad_rel_err"], 0.05)
        and out["fp8_compiled_grad_rel_err"] <= max(2 * out["bf16_grad_rel_err"], 0.05)
        and out["fp8_loss_rel_err"] < 0.01
    )
    return out


def median_ms(function, device: str, warmup: int = 3, repeats: int = 20) -> float:
    """The median time of `function()` in ms over `repeats` calls, after `warmup` calls (compilation, autotuning):
    on a GPU between two CUDA events around it, each call started with the queue drained (the GPU's time, launch
    gaps included); on CPU the host clock. The one timing loop of the kernel and block benches (the MoE-block
    results before 2026-12-06 were timed on the host clock with a synchronize each side: the same quantity)."""
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        if device == "cpu":
            start_s = time.perf_counter()
            function()
            times.append(1000 * (time.perf_counter() - start_s))
            continue
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return round(sorted(times)[len(times) // 2], 3)


def fp8_grouped_gemm(config, device, tokens: int) -> dict:
    """One expert GEMM of the model's shape alone (gate_up: tokens x top-k rows, hidden -> 2 x intermediate, rows
    spread unevenly over the experts): bf16 grouped GEMM against FP8 with row-wise scales, the rows' quantization
    included and alone; the FP8 kernel checked against its float32 emulation on the same FP8 values (must agree to
    accumulation rounding) and against the bf16 product. Timed on a GPU (median_ms)."""
    from fp8 import _emulated_grouped_mm, quantize_rows, quantized_copies, scaled_grouped_mm
    from transformers.integrations.moe import _grouped_mm

    experts, hidden, out_width = config.num_local_experts, config.hidden_size, 2 * config.intermediate_size
    generator = torch.Generator(device=device).manual_seed(0)
    weight = torch.randn(experts, hidden, out_width, device=device, generator=generator).to(torch.bfloat16) * 0.02
    rows_n = tokens * config.num_experts_per_tok
    share = torch.rand(experts, device=device, generator=generator) + 0.2
    counts = (share / share.sum() * rows_n).floor().to(torch.int64)
    counts[-1] += rows_n - int(counts.sum())
    offsets = torch.cumsum(counts, 0).to(torch.int32)
    rows = torch.randn(rows_n, hidden, device=device, generator=generator).to(torch.bfloat16)
    values, scales = quantized_copies(weight)["forward"]
    b = values.transpose(1, 2)

    quantize = torch.compile(quantize_rows) if device != "cpu" else quantize_rows
    q, s = quantize(rows)
    kernel = scaled_grouped_mm(q, b, s, scales, offsets, torch.bfloat16).float()
    emulated = _emulated_grouped_mm(q, b, s, scales, offsets)
    exact = _grouped_mm(rows.float(), weight.float(), offs=offsets) if device == "cpu" else None
    bf16 = _grouped_mm(rows, weight, offs=offsets).float()
    reference = exact if exact is not None else bf16

    flops = 2 * rows_n * hidden * out_width

    def timed(function) -> float:
        return median_ms(function, device) if device != "cpu" else float("nan")  # --tiny: the checks above only

    bf16_ms = timed(lambda: _grouped_mm(rows, weight, offs=offsets))
    fp8_ms = timed(lambda: scaled_grouped_mm(q, b, s, scales, offsets, torch.bfloat16))
    fast_ms = timed(lambda: scaled_grouped_mm(q, b, s, scales, offsets, torch.bfloat16, fast_accum=True))
    fast = scaled_grouped_mm(q, b, s, scales, offsets, torch.bfloat16, fast_accum=True).float()
    quantize_ms = timed(lambda: quantize(rows))
    return {
        "rows": rows_n, "experts": experts, "k": hidden, "n": out_width,
        "kernel_vs_emulation_rel": float((kernel - emulated).norm() / emulated.norm()),
        "fp8_vs_bf16_rel": float((kernel - reference).norm() / reference.norm()),
        "bf16_ms": bf16_ms, "fp8_ms": fp8_ms, "quantize_rows_ms": quantize_ms,
        "bf16_tflops": round(flops / bf16_ms / 1e9, 1), "fp8_tflops": round(flops / fp8_ms / 1e9, 1),
        "speedup_gemm": round(bf16_ms / fp8_ms, 2), "speedup_with_quantize": round(bf16_ms / (fp8_ms + quantize_ms), 2),
        "fast_accum_ms": fast_ms, "fast_accum_tflops": round(flops / fast_ms / 1e9, 1),
        "fast_accum_vs_emulation_rel": float((fast - emulated).norm() / emulated.norm()),
    }  # fmt: skip


def frozen_random(module) -> None:
    """The MoE-block benches' weights: normal(0, 0.02), frozen (LoRA on attention leaves the experts frozen)."""
    for parameter in module.parameters():
        torch.nn.init.normal_(parameter, std=0.02)
        parameter.requires_grad_(False)


def fp8_block(config, device, tokens: int) -> dict:
    """One MoE experts block of the model's shape, frozen weights, fixed routing (the same experts for every path:
    no router whose near ties could flip), forward + backward to the input: bf16 and FP8 experts, each eager and
    compiled (torch.compile of the block), against the block in fp32. Separates what FP8 and what the compiler
    change from routing; times each on a GPU (median_ms)."""
    import copy

    from fp8 import attach_fp8_experts
    from toolkit_train.kernels.moe import NAME, register
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    register()
    config._experts_implementation = NAME
    torch.manual_seed(0)
    with torch.device(device):
        reference = GptOssExperts(config).to(torch.float32)
    frozen_random(reference)
    hidden = torch.randn(tokens, config.hidden_size, device=device)
    scores = torch.randn(tokens, config.num_local_experts, device=device)
    weights, indices = torch.topk(scores.softmax(-1), config.num_experts_per_tok, dim=-1)
    probe = torch.randn(tokens, config.hidden_size, device=device)

    def run(module, dtype):
        x = hidden.to(dtype).clone().requires_grad_(True)
        out = module(x, indices, weights.to(dtype))
        (out.float() * probe).sum().backward()
        return out.detach().float(), x.grad.float()

    want = run(reference, torch.float32)
    bf16 = copy.deepcopy(reference).to(torch.bfloat16)
    fp8 = copy.deepcopy(bf16)
    attach_fp8_experts(fp8)
    result: dict = {"tokens": tokens}
    import fp8 as fp8_module

    paths = {"bf16": bf16, "bf16_compiled": torch.compile(bf16), "fp8": fp8, "fp8_compiled": torch.compile(fp8),
             "fp8_function_compiled": torch.compile(copy.deepcopy(fp8))}  # fmt: skip
    for label, module in paths.items():
        fp8_module.USE_FUNCTION = label == "fp8_function_compiled"  # the autograd.Function form (lost its backward)
        out, grad = run(module, torch.bfloat16)
        result[f"{label}_out_rel_err"] = float((out - want[0]).norm() / want[0].norm())
        result[f"{label}_grad_rel_err"] = float((grad - want[1]).norm() / want[1].norm())
        if device != "cpu":
            result[f"{label}_ms"] = median_ms(lambda m=module: run(m, torch.bfloat16), device)
    if device != "cpu":
        result["speedup_compiled"] = round(result["bf16_compiled_ms"] / result["fp8_compiled_ms"], 2)
    return result


def moe_block(config, device, tokens: int) -> dict:
    """One MoE block of the model's shape, frozen bf16 weights, forward + backward to the input: transformers'
    grouped_mm path against the toolkit's fused path on the same inputs (outputs and input gradients compared
    against an fp32 run of the reference)."""
    from toolkit_train.kernels.moe import register
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    register()
    torch.manual_seed(0)
    with torch.device(device):
        block = GptOssMLP(config).to(torch.bfloat16)
    frozen_random(block)
    hidden = torch.randn(1, tokens, config.hidden_size, device=device, dtype=torch.bfloat16)
    probe = torch.randn_like(hidden)

    def run(implementation: str, dtype=torch.bfloat16):
        config._experts_implementation = implementation
        block.to(dtype)
        x = hidden.to(dtype).detach().clone().requires_grad_(True)  # a fresh leaf: no gradient carried over
        out, _ = block(x)
        (out * probe.to(dtype)).sum().backward()
        return out.detach().float(), x.grad.float()

    reference = run("grouped_mm", torch.float32)
    result: dict = {"tokens": tokens}
    for implementation in ("grouped_mm", "toolkit_fused"):
        out, grad = run(implementation)
        result[f"{implementation}_out_rel_err"] = float((out - reference[0]).norm() / reference[0].norm())
        result[f"{implementation}_grad_rel_err"] = float((grad - reference[1]).norm() / reference[1].norm())
        result[f"{implementation}_ms"] = median_ms(lambda i=implementation: run(i), device)
    result["speedup"] = round(result["grouped_mm_ms"] / result["toolkit_fused_ms"], 2)
    return result


def _trained(rows):
    return sum(sum(1 for t in r["labels"][1:] if t != IGNORE_INDEX) for r in rows)


def _fast_grads(model, rows, device, experts="toolkit_fused"):
    import datasets
    from toolkit_train.kernels.packing import collate, packed_dataset, packed_trainer_class
    from trl import SFTConfig

    model.get_base_model().config._attn_implementation = FAST_ATTENTION
    model.get_base_model().config._experts_implementation = experts  # the fast path's MoE: fused by default
    packed = packed_dataset(datasets.Dataset.from_list(rows), 4096, seed=0)
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(output_dir=out, report_to="none", router_aux_loss_coef=0.0, remove_unused_columns=False,
                         dataset_kwargs={"skip_prepare_dataset": True}, use_cpu=device == "cpu",
                         bf16=device != "cpu")  # fmt: skip
        trainer = packed_trainer_class()(
            model=model, args=args, train_dataset=packed, data_collator=collate, processing_class=tokenizer()
        )
    model.zero_grad(set_to_none=True)
    batch = {k: v.to(device) for k, v in collate([packed[0]]).items()}
    loss = trainer.compute_loss(model, batch, num_items_in_batch=_trained(rows))
    loss.backward()
    return loss.item(), _grad_vector(model)


def _recipe_grads(model, rows, device, attention):
    model.get_base_model().config._attn_implementation = attention
    model.get_base_model().config._experts_implementation = "grouped_mm"  # transformers' own path
    model.zero_grad(set_to_none=True)
    total, trained = 0.0, _trained(rows)
    for row in rows:
        n = sum(1 for t in row["labels"][1:] if t != IGNORE_INDEX)
        ids = torch.tensor([row["input_ids"]], device=device)
        out = model(input_ids=ids, labels=torch.tensor([row["labels"]], device=device), output_router_logits=False)
        (out.loss * n / trained).backward()
        total += out.loss.item() * n / trained
    return total, _grad_vector(model)


def _grad_vector(model):
    return torch.cat([p.grad.double().flatten() for p in model.parameters() if p.requires_grad]).cpu()


PLAN = {  # name: (variant, max_length, tokens per micro-batch (None: --budget), gradient checkpointing, warmup)
    "recipe": ("recipe", 2048, 2048, True, 4),
    "toolkit": ("toolkit", 2048, None, False, 2),
    "toolkit-8k": ("toolkit", 2048, 8192, False, 2),
    "toolkit-12k": ("toolkit", 2048, 12288, False, 2),
    "toolkit-12k-ref": ("toolkit", 2048, 12288, False, 2),  # -ref: transformers' grouped_mm experts
    "toolkit-16k": ("toolkit", 2048, 16384, False, 2),
    "toolkit-12k-compiled": ("toolkit", 2048, 12288, False, 3),  # -compiled: each decoder layer torch.compiled
    "toolkit-8k-compiled": ("toolkit", 2048, 8192, False, 3),
    # the recipe's rows per optimizer step: 2,048-token micro-batches hold ~2 rows, the recipe's 1 row x 2 steps
    "toolkit-2k-compiled": ("toolkit", 2048, 2048, False, 3),
    "recipe-again": ("recipe", 2048, 2048, True, 4),  # the baseline measured twice in one run: its spread
    "toolkit-gc": ("toolkit", 2048, None, True, 2),
    "toolkit-4k-seq": ("toolkit", 4096, 4096, True, 2),
}
PACKED = {  # model.experts: mxfp4. name: (shape, max_length, tokens per micro-batch, checkpointing, warmup)
    "20b-mxfp4-12k": ("20b", 2048, 12288, False, 2),  # against toolkit-12k: what on-the-fly dequantization costs
    "120b-mxfp4-4k-gc": ("120b", 4096, 4096, True, 2),
    "120b-mxfp4-6k-gc": ("120b", 4096, 6144, True, 2),
    "120b-mxfp4-8k-gc": ("120b", 4096, 8192, True, 2),
    "120b-mxfp4-12k-gc": ("120b", 4096, 12288, True, 2),
    "120b-mxfp4-16k-gc": ("120b", 4096, 16384, True, 2),
    "120b-mxfp4-24k-gc": ("120b", 4096, 24576, True, 2),
    "120b-mxfp4-32k-gc": ("120b", 4096, 32768, True, 2),
    "120b-mxfp4-8k": ("120b", 4096, 8192, False, 2),
}
EXPERT_LORA = {  # the same with LoRA on the MoE experts too
    "recipe-experts": "recipe",
    "toolkit-experts": "toolkit-gc",
    "toolkit-experts-8k": "toolkit-8k",
}
EXPERT_PARAMETERS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
EXPERTS_SUFFIX = "-experts"  # a PACKED name + this: the same run with LoRA on the packed experts too
# ... + "-rN": with the experts at a rank of their own (lora.expert_r), e.g. 120b-mxfp4-16k-gc-experts-r4
EAGER_NORMS_SUFFIX = "-eager-norms"  # last: transformers' eager RMSNorms instead of FusedRMSNorm (the path before #48)
PEFT_CAST_SUFFIX = "-peft-cast"  # last: peft's fp32 input cast kept under autocast (the path before #48's second lever)
# very last on a PACKED name: attention blocks and routers compiled (kernels/mxfp4.py: compile_packed_layers)
COMPILED_SUFFIX = "-compiled"
FP8_SUFFIX = "-fp8"  # very last on a PLAN name: the frozen experts' GEMMs in FP8 (toolkit_train/fp8.py; #48's lever)


def packed_name(name: str) -> tuple[str, bool, int | None]:
    """A PACKED variant's name -> (its PACKED key, expert LoRA or not, lora.expert_r or None)."""
    name = name.removesuffix(COMPILED_SUFFIX)
    key, experts, rank = name.removesuffix(PEFT_CAST_SUFFIX).removesuffix(EAGER_NORMS_SUFFIX).partition(EXPERTS_SUFFIX)
    return key, bool(experts), int(rank.removeprefix("-r")) if rank else None


def run_one(name: str, args, device, dtype) -> dict:
    from toolkit_train.run.model import add_lora
    from toolkit_train.settings import LoraSettings

    if name == "gate":
        return correctness_gate(gpt_oss_config(args.tiny, layers=2), device, 2048)
    if name == "compile-diag":
        return {"name": name, **compile_diagnosis(gpt_oss_config(args.tiny, layers=2), device)}
    if name == "moe-block":
        return {"name": name, **moe_block(gpt_oss_config(args.tiny, layers=1), device, args.budget)}
    if name == "fp8-gate":
        return {"name": name, **fp8_gate(gpt_oss_config(args.tiny, layers=2), device)}
    if name == "fp8-block":
        return {"name": name, **fp8_block(gpt_oss_config(args.tiny, layers=1), device, args.budget)}
    if name == "fp8-gemm":
        return {"name": name, **fp8_grouped_gemm(gpt_oss_config(args.tiny, layers=1), device, args.budget)}
    # the mxfp4 gates: --gate-layers decoder layers of --gate-size's shape (default: 2 layers of 20b's, 32 experts)
    gate_config = gpt_oss_config(args.tiny, layers=args.gate_layers, size=args.gate_size)
    gate_shape = {"shape": "tiny" if args.tiny else args.gate_size, "layers": args.gate_layers}
    if name == "mxfp4-gate":
        return {"name": name, **gate_shape, **packed_gate(gate_config, device)}
    if name == "mxfp4-compiled-gate":  # the compiled part of mxfp4-gate alone (the whole gate ran past one call)
        from toolkit_train.kernels.moe import register

        register()  # the packed model asks for toolkit_fused by the second build; the whole gate registers it earlier
        result = compiled_packed_gate(gate_config, device, fp32_gate_rows(gate_config))
        return {"name": name, **gate_shape, **result, "passed": result["compiled_passed"]}
    if packed_name(name)[0] in PACKED:
        return run_packed(name, args, device)
    fp8 = name.endswith(FP8_SUFFIX)
    base_name = name.removesuffix(FP8_SUFFIX).removesuffix(PEFT_CAST_SUFFIX)
    variant, max_length, budget, checkpointing, warmup = PLAN[EXPERT_LORA.get(base_name, base_name)]
    experts = "grouped_mm" if variant == "recipe" or base_name.endswith("-ref") else "toolkit_fused"
    budget = budget or args.budget
    config = gpt_oss_config(args.tiny)
    targets = EXPERT_PARAMETERS if base_name in EXPERT_LORA else []
    lora = LoraSettings(r=8, alpha=16, dropout=0.0, target_parameters=targets)
    model = add_lora(build_model(config, device, dtype, "eager", experts), lora, seed=0)
    if name.removesuffix(FP8_SUFFIX) != base_name:
        _peft_cast_again(model)
    if fp8:  # the FP8 copies, attached before compiling (the layers trace the FP8 path)
        from fp8 import attach_fp8_experts

        attach_fp8_experts(model)
    if base_name.endswith("-compiled"):  # what the entrypoint does on GPU (training.compile_layers: auto)
        from toolkit_train.run.model import compile_decoder_layers

        compile_decoder_layers(model)
    rows = synthetic_rows(args.rows, max_length, config.vocab_size)
    steps = args.steps * (4 if variant == "recipe" else 1)
    with tempfile.TemporaryDirectory() as out:
        row = measure(model, variant, rows, steps, warmup, max_length, budget, checkpointing, Path(out), experts)
    epoch_tokens = sum(row_lengths(1000, 2048))
    if "tokens_per_s" in row:  # one epoch of 1,000 Multilingual-Thinking-sized rows
        row["epoch_1000_rows_min"] = round(epoch_tokens / row["tokens_per_s"] / 60, 2)
    return {"name": name, **row, "expert_gemms": "fp8 (e4m3, row-wise)" if fp8 else "bf16"}


def run_packed(name: str, args, device) -> dict:
    """gpt-oss with packed MXFP4 experts; 120b: LoRA r16/alpha32 on q/k/v/o (the HyperPod recipe's), 4,096-token
    rows."""
    from toolkit_train.run.model import add_lora
    from toolkit_train.settings import LoraSettings

    key, expert_lora, expert_r = packed_name(name)
    size, max_length, budget, checkpointing, warmup = PACKED[key]
    compiled = name.endswith(COMPILED_SUFFIX)
    name_ = name.removesuffix(COMPILED_SUFFIX)
    config = gpt_oss_config(args.tiny, size=size)
    targets = EXPERT_PARAMETERS if expert_lora else []
    lora = LoraSettings(r=8, alpha=16, dropout=0.0, target_parameters=targets, expert_r=expert_r)
    if size == "120b":
        lora = LoraSettings(r=16, alpha=32, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                            target_parameters=targets, expert_r=expert_r)  # fmt: skip
    fused_norms = not name_.removesuffix(PEFT_CAST_SUFFIX).endswith(EAGER_NORMS_SUFFIX)
    model = add_lora(build_packed_model(config, device, "eager", fused_norms), lora, seed=0)
    peft_cast = name_.endswith(PEFT_CAST_SUFFIX)
    if peft_cast:
        _peft_cast_again(model)
    if compiled:  # what the entrypoint does on GPU with model.experts: mxfp4 (training.compile_layers)
        from toolkit_train.kernels.mxfp4 import compile_packed_layers

        compile_packed_layers(model)
        warmup += 1  # the first step compiles (as the bf16 path's -compiled variants)
    rows = synthetic_rows(args.rows, max_length, config.vocab_size)
    with tempfile.TemporaryDirectory() as out:
        row = measure(model, "toolkit", rows, args.steps, warmup, max_length, budget, checkpointing, Path(out),
                      "toolkit_fused", size)  # fmt: skip
    lora_on = f"attention + experts r{lora.expert_r or lora.r}" if targets else "attention"
    return {
        "name": name,
        **row,
        "experts": "mxfp4 (packed)",
        "lora": f"r{lora.r} {lora_on}",
        "norms": "fused (compiled)" if fused_norms else "eager (transformers)",
        "lora_input": "peft's fp32 cast" if peft_cast else "as autocast casts it",
        "compiled": "attention + router per layer" if compiled else "no",
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        **({"dynamo": dynamo_counts()} if torch.cuda.is_available() else {}),
    }


H100_80GB_GB = 85.52  # 81,559 MiB, the total nvidia-smi reports for an "80GB" H100 (and what a p5's GPUs have)


def emulate_gpu_size(device: str, gb: float) -> None:
    """A smaller GPU on this one: PyTorch's allocator may hold `gb` less what the process already has outside it
    (the CUDA context), and raises OutOfMemoryError past that, as it would there (after freeing its cache)."""
    torch.zeros(1, device=device)  # create the context first: it counts against the GPU, not the allocator
    total = torch.cuda.get_device_properties(device).total_memory
    limit = gb * 1e9 - outside_allocator_bytes(device)
    torch.cuda.set_per_process_memory_fraction(max(0.0, min(1.0, limit / total)), device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true", help="tiny shape on CPU: a smoke test of this script")
    parser.add_argument("--variants", default="gate,recipe,toolkit,toolkit-8k,toolkit-gc,toolkit-4k-seq")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--budget", type=int, default=16384, help="tokens per packed micro-batch")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--tag", default="", help="suffix of the result file, e.g. _experts")
    parser.add_argument("--gpu-memory-gb", type=float, default=0.0,
                        help=f"run as on a GPU of this many GB in all ({H100_80GB_GB}: an H100 80GB)")  # fmt: skip
    parser.add_argument("--memory-peak", action="store_true", help="what is alive at the last step's peak, by size")
    parser.add_argument("--profile", action="store_true", help="GPU time by kernel class (torch.profiler)")
    parser.add_argument("--gate-layers", type=int, default=2, help="decoder layers of the mxfp4 gates' model")
    parser.add_argument("--gate-size", choices=sorted(ACTIVE_PARAMS), default="20b",
                        help="the mxfp4 gates' shape (120b: 128 experts a layer); --tiny: the tiny shape")  # fmt: skip
    parser.add_argument("--only", help=argparse.SUPPRESS)  # one variant in this process (a child)
    args = parser.parse_args()

    global FAST_ATTENTION, MEMORY_AT_PEAK, PROFILE
    PROFILE = args.profile
    if args.tiny:
        FAST_ATTENTION = "eager"
    if args.memory_peak and not args.tiny:
        MEMORY_AT_PEAK = {}
    device = "cpu" if args.tiny else f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    if device != "cpu":
        torch.cuda.set_device(device)
        if args.gpu_memory_gb:
            emulate_gpu_size(device, args.gpu_memory_gb)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    if args.only:
        result = run_one(args.only, args, device, dtype)
        if args.gpu_memory_gb:
            result["gpu_memory_cap_gb"] = args.gpu_memory_gb  # the GPU it ran as
        if int(os.environ.get("RANK", "0")) == 0:
            print("RESULT " + json.dumps(result), flush=True)
            if args.tag and args.only in GATE_KEYS:  # a gate alone, its result file as run_all writes it
                write_gate_result(args, result)
        return
    run_all(args)


GATE_KEYS = {"gate": "correctness", "moe-block": "moe_block", "mxfp4-gate": "mxfp4_correctness",
             "mxfp4-compiled-gate": "mxfp4_compiled_correctness", "fp8-gate": "fp8_correctness",
             "fp8-gemm": "fp8_grouped_gemm", "fp8-block": "fp8_block"}  # fmt: skip


def write_gate_result(args, result: dict) -> None:
    """`--only GATE --tag T`: bench/results/train_throughput_1gpu{T}.json (_tiny{T} with --tiny) with the gate's
    result under run_all's key, and the command line that made it."""
    import transformers
    from common import report

    results = {"device": torch.cuda.get_device_name() if not args.tiny else "cpu", "world_size": 1,
               "torch": torch.__version__, "transformers": transformers.__version__,
               "command": " ".join(["python3", "bench/train_throughput.py", *sys.argv[1:]]),
               GATE_KEYS[args.only]: result}  # fmt: skip
    report(f"train_throughput{'_tiny' if args.tiny else '_1gpu'}{args.tag}", [], results)


def run_all(args) -> None:
    """Each variant in a fresh process (torchrun for several GPUs): no memory carried between them."""
    import subprocess

    import transformers

    gpus = torch.cuda.device_count() if not args.tiny else 0
    world = int(os.environ.get("BENCH_GPUS", gpus or 1))
    launcher = (
        [sys.executable] if world <= 1 else [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}"]
    )
    results: dict = {"device": torch.cuda.get_device_name() if gpus else "cpu", "world_size": world,
                     "torch": torch.__version__, "transformers": transformers.__version__}  # fmt: skip
    rows = []
    for name in args.variants.split(","):
        if name in GATE_KEYS and world > 1:
            continue
        command = [*launcher, __file__, "--only", name, "--steps", str(args.steps), "--budget", str(args.budget),
                   "--rows", str(args.rows), "--gpu-memory-gb", str(args.gpu_memory_gb),
                   "--gate-layers", str(args.gate_layers), "--gate-size", args.gate_size,
                   *(["--memory-peak"] if args.memory_peak else []), *(["--profile"] if args.profile else []),
                   *(["--tiny"] if args.tiny else [])]  # fmt: skip
        env = dict(os.environ) if world > 1 or args.tiny else dict(os.environ, CUDA_VISIBLE_DEVICES="0")
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        found = [line[7:] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if not found:
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            result = {"name": name, "error": "out of memory" if "OutOfMemory" in done.stderr else " | ".join(tail)}
        else:
            result = json.loads(found[-1])
        print(json.dumps(result), flush=True)
        for part in result.get("memory_at_peak", {}).get("rows", []):
            print(f"  {part['gb']:8.2f} GB {part['tensors']!s:>6}  {part['allocated_at']}", flush=True)
        if name in GATE_KEYS:
            results[GATE_KEYS[name]] = result
        else:
            rows.append(result)
    baselines = {r["name"]: r for r in rows if r["name"] in ("recipe", "recipe-experts") and "tokens_per_s" in r}
    for row in rows:  # against the recipe with the same LoRA targets, measured in this run
        recipe = baselines.get("recipe-experts" if row["name"] in EXPERT_LORA else "recipe")
        if recipe and "tokens_per_s" in row:
            row["vs_recipe"] = round(row["tokens_per_s"] / recipe["tokens_per_s"], 2)
    results["rows"] = rows
    from common import report

    table = [{k: r.get(k, "") for k in ("name", "attention", "experts", "expert_gemms", "lora", "packing", "gc",
                                         "max_length",
                                         "norms", "lora_input", "compiled",
                                         "tokens_per_micro_batch", "rows_per_optimizer_step", "tokens_per_s",
                                         "vs_recipe", "step_s",
                                         "peak_mem_gb", "peak_reserved_gb", "outside_allocator_gb", "gpu_memory_cap_gb",
                                         "mfu", "epoch_1000_rows_min",
                                         "error")}
             for r in rows]  # fmt: skip
    suffix = "_tiny" if args.tiny else f"_{world}gpu"
    report(f"train_throughput{suffix}{args.tag}", table, results)


if __name__ == "__main__":
    main()
