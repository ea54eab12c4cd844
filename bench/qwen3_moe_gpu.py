"""Qwen3-MoE through the real training entrypoint on one GPU (issue 47's GPU measurement).

Qwen3-30B-A3B's width (hidden 2048, 32 query / 4 KV heads of 128, 128 experts of 768 with 8 active, a 151,936-token
vocabulary) with a few of its 48 layers, random bf16 weights (not pretrained) and the tiny Qwen3's tokenizer and
chat template, saved as a Qwen3-MoE checkpoint and trained through `entrypoints/toolkit_train/train.py` as a training
job runs it: the `qwen3-30b-a3b-lora` preset's LoRA (r8/alpha16 on q/k/v/o), then the same with expert LoRA
(`lora.target_parameters`: the 3-D experts), packed micro-batches of the bundled sample, flex attention,
transformers' experts, no recomputation. Per run: tokens/s (median of the steady steps' metric lines), the losses,
the `[toolkit] trained:` line (which LoRA groups moved, which experts class ran) and the peak GPU memory line.
Writes bench/results/qwen3_moe_gpu.json.

  python bench/qwen3_moe_gpu.py [--layers 4] [--steps 12] [--tokens 4096]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "entrypoints"))
sys.path.insert(0, str(REPO / "bench"))

from common import report
from entrypoint_gpu import run, slice_row
from toolkit_train.settings import TrainSettings

EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def write_checkpoint(out: Path, layers: int) -> float:
    """Qwen3-30B-A3B's shape with `layers` layers, random bf16 weights; GB written."""
    import torch
    from toolkit_train.builtin.tiny_qwen3 import build_tokenizer
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = build_tokenizer()
    config = Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=768, max_position_embeddings=40960, rope_theta=1e6, norm_topk_prob=True,
        tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, dtype="bfloat16",
    )  # fmt: skip
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3MoeForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
    del model
    torch.cuda.empty_cache()
    return size


def settings(model: Path, steps: int, tokens: int, experts: bool) -> TrainSettings:
    lora = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    return TrainSettings.model_validate({
        "model": {"id": str(model), "dtype": "bfloat16"},
        "data": {"source": "builtin:multilingual-thinking-sample", "format": "multilingual-thinking",
                 "max_length": 2048},
        "lora": {**lora, **({"target_parameters": EXPERTS} if experts else {})},
        "training": {"learning_rate": 1e-4, "max_steps": steps, "packing": True, "tokens_per_micro_batch": tokens,
                     "gradient_checkpointing": False, "save_steps": 0, "warmup_ratio": 0.1,
                     "merge_adapter": False},
    })  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per packed micro-batch")
    parser.add_argument("--timeout", type=float, default=240, help="each entrypoint run's limit, seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(scratch) / "qwen3-30b-a3b-slice"
        size = write_checkpoint(model, args.layers)
        rows, results = [], {}
        for label, experts in (("LoRA q/k/v/o", False), ("LoRA q/k/v/o + experts", True)):
            result = run(Path(scratch) / label.replace(" ", "_").replace("/", ""),
                         settings(model, args.steps, args.tokens, experts), args.timeout)  # fmt: skip
            results[label] = result
            row = slice_row(label, result)
            row.update(peak_gpu=result["peak_gpu"], trained=result["trained"][:300], tail=result["tail"][-1500:])
            rows.append(row)
            print(row, flush=True)
    shape = (f"Qwen3-30B-A3B width, {args.layers} of 48 layers ({size:.1f} GB bf16), {args.tokens}-token packed "
             "micro-batches")  # fmt: skip
    table = [{"shape": shape, **{k: r[k] for k in ("run", "rc", "tokens_per_s", "seconds", "first_loss", "last_loss",
                                                    "peak_gpu")}} for r in rows]  # fmt: skip
    report("qwen3_moe_gpu", table, {"rows": rows, "shape": shape})


if __name__ == "__main__":
    main()
