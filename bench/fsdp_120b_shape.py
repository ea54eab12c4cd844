"""The FSDP path on gpt-oss-120b's shape at reduced depth, through the real entrypoint under torchrun.

Builds a random-weight model with gpt-oss-120b's layer shape (hidden 2880, 128 experts, top-4, 201k vocab)
and `--layers` layers, saves it, and runs entrypoints/toolkit_train/train.py with the 120b preset's settings (FSDP, LoRA
r16 on q/k/v/o, 4k sequences, checkpoint every few steps), then again to check the resume. Prints the metrics
lines, the checkpoints and the merged model rank 0 wrote.

  python bench/fsdp_120b_shape.py --gpus 2 --layers 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "entrypoints"))  # the training package, from a checkout
sys.path.insert(0, str(REPO))


def build(out: Path, layers: int) -> None:
    import torch
    from toolkit_train.builtin.tiny_model import build_tokenizer
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(
        hidden_size=2880, intermediate_size=2880, num_hidden_layers=layers, num_attention_heads=64,
        num_key_value_heads=8, head_dim=64, num_local_experts=128, num_experts_per_tok=4, vocab_size=201088,
        sliding_window=128, layer_types=["sliding_attention", "full_attention"] * (layers // 2),
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GptOssForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    del model
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()

    from toolkit_train.settings import to_hyperparameters

    from toolkit.config import load_config

    work = Path(tempfile.mkdtemp(prefix="fsdp-"))
    model_dir = work / "model-120b-shape"
    build(model_dir, args.layers)
    settings = load_config(
        "gpt-oss-120b-lora",
        [f"model.id={model_dir}", "data.source=builtin:multilingual-thinking-sample", "data.max_length=4096",
         f"training.max_steps={args.steps}", f"training.save_steps={args.steps // 2}", "training.logging_steps=1"],
    ).train_settings()  # fmt: skip
    root = work / "job"
    (root / "input" / "config").mkdir(parents=True)
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(to_hyperparameters(settings)))
    env = dict(os.environ, TOOLKIT_ML_ROOT=str(root), PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.gpus}",
               str(REPO / "entrypoints" / "toolkit_train" / "train.py")]  # fmt: skip
    first = subprocess.run(command, env=env, capture_output=True, text=True)
    keep = [line for line in first.stdout.splitlines() if line.startswith(("[metrics]", "[toolkit]"))]
    print("\n".join(keep))
    if first.returncode != 0:
        print(first.stderr[-4000:])
        sys.exit(first.returncode)
    checkpoints = sorted(p.name for p in (root / "checkpoints").glob("checkpoint-*"))
    print("checkpoints:", checkpoints)
    # resume: drop the final checkpoint and the model; the same job must continue from the one before
    import shutil

    shutil.rmtree(root / "checkpoints" / checkpoints[-1])
    shutil.rmtree(root / "model")
    second = subprocess.run(command, env=env, capture_output=True, text=True)
    print("\n".join(line for line in second.stdout.splitlines() if line.startswith("[toolkit]")))
    merged = (
        sorted(p.name for p in (root / "model" / "merged").iterdir()) if (root / "model" / "merged").exists() else []
    )
    result = {
        "gpus": args.gpus,
        "layers": args.layers,
        "first_rc": first.returncode,
        "resume_rc": second.returncode,
        "resumed": "resuming from" in second.stdout,
        "checkpoints": checkpoints,
        "merged_files": merged[:6],
        "metrics": keep[-3:],
    }
    print("RESULT", json.dumps(result))
    if second.returncode != 0:
        print(second.stderr[-3000:])


if __name__ == "__main__":
    main()
