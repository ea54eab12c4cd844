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
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from entrypoints.data import IGNORE_INDEX
from entrypoints.settings import TrainSettings

PEAK_BF16_FLOPS = 790e12  # measured on this H200 (8192^3 bf16 matmul, random data)
ACTIVE_PARAMS_20B = 3.6e9
FAST_ATTENTION = "flex_attention"  # --tiny runs on CPU, where flex cannot do gpt-oss's sinks: eager there


def gpt_oss_config(tiny: bool, layers: int | None = None):
    from transformers import GptOssConfig

    if tiny:
        shape = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                     vocab_size=1024, sliding_window=32)  # fmt: skip
    else:  # gpt-oss-20b
        shape = dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64,
                     num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
                     vocab_size=201088, sliding_window=128)  # fmt: skip
    if layers:
        shape["num_hidden_layers"] = layers
    n = shape["num_hidden_layers"]
    return GptOssConfig(
        **shape,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)],
        max_position_embeddings=131072,
        tie_word_embeddings=False,
    )


def build_model(config, device, dtype, attn):
    from transformers import GptOssForCausalLM

    config._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device(device):
        model = GptOssForCausalLM(config).to(dtype)
    model.config.use_cache = False
    return model


def tokenizer():
    """Rows are pre-tokenized; the trainer only needs a tokenizer object (pad id): the tiny harmony one."""
    from entrypoints.tiny_model import build_tokenizer

    return build_tokenizer()


def synthetic_rows(n: int, max_length: int, vocab: int, seed: int = 0) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.exp(torch.randn(n, generator=generator) * 0.6 + math.log(1000)).clamp(64, max_length)
    rows = []
    for length in lengths.long().tolist():
        ids = torch.randint(0, vocab, (length,), generator=generator).tolist()
        prompt = int(0.35 * length)
        rows.append({"input_ids": ids, "labels": [IGNORE_INDEX] * prompt + ids[prompt:]})
    return rows


def settings_for(variant: str, max_length: int, budget: int, checkpointing: bool) -> TrainSettings:
    recipe = variant == "recipe"
    return TrainSettings.model_validate(
        {
            "model": {"id": "openai/gpt-oss-20b", "attn_implementation": "eager" if recipe else FAST_ATTENTION},
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
        }  # fmt: skip
    )


def make_trainer(model, settings: TrainSettings, rows: list[dict], steps: int, out: Path):
    import datasets
    from transformers import TrainerCallback
    from trl import SFTTrainer

    from entrypoints.packing import collate, packed_dataset, packed_trainer_class
    from entrypoints.train import Paths, sft_config

    paths = Paths(root=out, model_dir=out / "model", checkpoints=out / "ckpt", train_channel=out, output_data=out)
    args = sft_config(settings, paths)
    args.max_steps, args.report_to, args.save_strategy = steps, [], "no"
    dataset = datasets.Dataset.from_list(rows)
    base, extra = SFTTrainer, {}
    if settings.training.packing:
        budget = settings.training.tokens_per_micro_batch
        dataset = packed_dataset(dataset, budget, seed=0)
        base = packed_trainer_class()
        extra = {"data_collator": lambda f: collate(f, pad_to=budget)}
    if settings.training.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
    stamps: list[float] = []
    tokens: list[int] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())

    class Counting(base):  # type: ignore[misc, valid-type]
        def training_step(self, model, inputs, num_items_in_batch=None):
            real = inputs["document_ids"] >= 0 if "document_ids" in inputs else inputs["input_ids"] >= 0
            tokens.append(int(real.sum()))
            return super().training_step(model, inputs, num_items_in_batch)

    trainer = Counting(
        model=model, args=args, train_dataset=dataset, callbacks=[Clock()], processing_class=tokenizer(), **extra
    )
    return trainer, stamps, tokens


def measure(model, variant, rows, steps, warmup, max_length, budget, checkpointing, out):
    settings = settings_for(variant, max_length, budget, checkpointing)
    model.config._attn_implementation = settings.model.attn_implementation
    trainer, stamps, tokens = make_trainer(model, settings, rows, warmup + steps, out)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
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
        "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 1) if torch.cuda.is_available() else 0,
        "mfu": round(rate * 6 * ACTIVE_PARAMS_20B / PEAK_BF16_FLOPS, 3),
    }


def correctness_gate(config, device, dtype, max_length):
    """Fast path (flex, packed, chunked loss) vs recipe path (eager, one row per forward) on the same rows."""
    import datasets
    from trl import SFTConfig

    from entrypoints.model import add_lora
    from entrypoints.packing import collate, packed_dataset, packed_trainer_class
    from entrypoints.settings import LoraSettings

    rows = synthetic_rows(3, min(max_length, 600), config.vocab_size, seed=1)
    model = add_lora(build_model(config, device, dtype, FAST_ATTENTION), LoraSettings(dropout=0.0), seed=0)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    packed = packed_dataset(datasets.Dataset.from_list(rows), 4096, seed=0)
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(output_dir=out, report_to="none", router_aux_loss_coef=0.0, remove_unused_columns=False,
                         dataset_kwargs={"skip_prepare_dataset": True}, use_cpu=device == "cpu",
                         bf16=device != "cpu")  # fmt: skip
        trainer = packed_trainer_class()(
            model=model, args=args, train_dataset=packed, data_collator=collate, processing_class=tokenizer()
        )
    trained = sum(sum(1 for t in r["labels"][1:] if t != IGNORE_INDEX) for r in rows)
    batch = {k: v.to(device) for k, v in collate([packed[0]]).items()}
    fast = trainer.compute_loss(model, batch, num_items_in_batch=trained)
    fast.backward()
    fast_grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.requires_grad])
    model.zero_grad()
    model.get_base_model().config._attn_implementation = "eager"
    recipe = 0.0
    for row in rows:
        n = sum(1 for t in row["labels"][1:] if t != IGNORE_INDEX)
        ids = torch.tensor([row["input_ids"]], device=device)
        out = model(input_ids=ids, labels=torch.tensor([row["labels"]], device=device), output_router_logits=False)
        (out.loss * n / trained).backward()
        recipe += out.loss.item() * n / trained
    recipe_grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.requires_grad])
    del model, trainer
    return {
        "loss_fast": round(fast.item(), 5),
        "loss_recipe": round(recipe, 5),
        "loss_rel_diff": abs(fast.item() - recipe) / abs(recipe),
        "grad_rel_diff": float((fast_grads - recipe_grads).norm() / recipe_grads.norm()),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true", help="tiny shape on CPU: a smoke test of this script")
    parser.add_argument("--variants", default="recipe,toolkit,toolkit-gc,toolkit-4k")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--budget", type=int, default=16384, help="tokens per packed micro-batch")
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args()

    global FAST_ATTENTION
    if args.tiny:
        FAST_ATTENTION = "eager"
    device = "cpu" if args.tiny else f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    if device != "cpu":
        torch.cuda.set_device(device)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    rank0 = int(os.environ.get("RANK", "0")) == 0
    config = gpt_oss_config(args.tiny)
    results: dict = {"device": torch.cuda.get_device_name() if device != "cpu" else "cpu",
                     "world_size": int(os.environ.get("WORLD_SIZE", "1")), "torch": torch.__version__}  # fmt: skip
    import transformers

    results["transformers"] = transformers.__version__
    if "recipe" in args.variants and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        results["correctness"] = correctness_gate(gpt_oss_config(args.tiny, layers=2), device, dtype, 2048)
        if rank0:
            print("correctness gate:", json.dumps(results["correctness"]), flush=True)

    from entrypoints.model import add_lora
    from entrypoints.settings import LoraSettings

    model = add_lora(build_model(config, device, dtype, "eager"), LoraSettings(r=8, alpha=16, dropout=0.0), seed=0)
    rows = {
        2048: synthetic_rows(args.rows, 2048, config.vocab_size),
        4096: synthetic_rows(args.rows, 4096, config.vocab_size),
    }
    plan = {
        "recipe": ("recipe", 2048, 2048, True, 4),
        "toolkit": ("toolkit", 2048, args.budget, False, 2),
        "toolkit-gc": ("toolkit", 2048, args.budget, True, 2),
        "toolkit-4k": ("toolkit", 4096, 4096, True, 2),
    }
    rows_out = []
    with tempfile.TemporaryDirectory() as out:
        for name in args.variants.split(","):
            variant, max_length, budget, checkpointing, warmup = plan[name]
            steps = args.steps * (4 if variant == "recipe" else 1)
            row = measure(model, variant, rows[max_length], steps, warmup, max_length, budget, checkpointing, Path(out))
            row["name"] = name
            rows_out.append(row)
            if rank0:
                print(json.dumps(row), flush=True)
    recipe = next((r for r in rows_out if r["name"] == "recipe" and "tokens_per_s" in r), None)
    for row in rows_out:
        if recipe and "tokens_per_s" in row:
            row["vs_recipe"] = round(row["tokens_per_s"] / recipe["tokens_per_s"], 2)
        if "tokens_per_s" in row:  # one epoch of 1,000 Multilingual-Thinking-sized rows
            epoch_tokens = sum(len(r["input_ids"]) for r in rows[2048][:1000])
            row["epoch_1000_rows_min"] = round(epoch_tokens / row["tokens_per_s"] / 60, 2)
    results["rows"] = rows_out
    if rank0:
        from common import report

        report("train_throughput" + ("_tiny" if args.tiny else f"_{results['world_size']}gpu"), rows_out, results)


if __name__ == "__main__":
    main()
