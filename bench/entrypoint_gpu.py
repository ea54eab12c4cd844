"""The real training entrypoint on a GPU, as a training job runs it: compiled decoder layers (compile_layers: auto)
against the same run uncompiled, then a stop at a checkpoint and a resume.

Same tiny gpt-oss (the builtin's architecture and tokenizer, random weights: not pretrained), same sample
data, packed 2,048-token micro-batches, flex attention, the fused MoE path. Compares the per-step losses of the
compiled and uncompiled runs (same seed, same batches: they must agree to bf16 rounding) and their wall times;
then trains the compiled run on from its step-20 checkpoint to step 30. Prints a table; writes
bench/results/entrypoint_gpu.json.

`--shape 120b-slice` instead: gpt-oss-120b's width (128 experts, 201k vocabulary) with a few of its 36 layers,
written as an MXFP4 checkpoint (random values: not pretrained), trained through the entrypoint as the
`gpt-oss-120b-lora-1node` preset does (model.experts: mxfp4, LoRA r16/alpha32 on q/k/v/o, 4,096-token rows,
recomputation), stopped at a checkpoint, resumed and merged (the merge keeps the experts MXFP4). Writes
bench/results/entrypoint_gpu_120b_slice.json.

`--expert-lora`: the experts adapted too (lora.target_parameters, expert_r 8), written to
bench/results/entrypoint_gpu_120b_slice_expert_lora.json. Each run's `[toolkit] trained:` line
(toolkit_train/trained.py: which groups received gradients and moved, which experts class ran) is kept.

  python bench/entrypoint_gpu.py [--shape 120b-slice --layers 8 [--expert-lora]]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "entrypoints"))  # the training package, from a checkout
sys.path.insert(0, str(REPO))

from common import report
from toolkit_train.settings import TrainSettings, to_hyperparameters


def settings(model: Path, compile_layers: bool | str, max_steps: int) -> TrainSettings:
    return TrainSettings.model_validate(
        {
            "model": {"id": str(model)},
            "data": {
                "source": "builtin:multilingual-thinking-sample",
                "format": "multilingual-thinking",
                "max_length": 512,
            },
            "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
            "training": {
                "learning_rate": 5e-3,
                "max_steps": max_steps,
                "packing": True,
                "tokens_per_micro_batch": 2048,
                "gradient_checkpointing": False,
                "save_steps": 10,
                "warmup_ratio": 0.1,
                "compile_layers": compile_layers,
                "merge_adapter": False,
            },
        }
    )


EXPERT_LORA = {"target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], "expert_r": 8}


def slice_settings(model: Path, max_steps: int, expert_lora: bool = False) -> TrainSettings:
    lora = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    return TrainSettings.model_validate(
        {
            "model": {"id": str(model), "experts": "mxfp4"},
            "data": {
                "source": "builtin:multilingual-thinking-sample",
                "format": "multilingual-thinking",
                "max_length": 4096,
            },
            "lora": {**lora, **(EXPERT_LORA if expert_lora else {})},
            "training": {
                "learning_rate": 1e-4,
                "max_steps": max_steps,
                "packing": True,
                "tokens_per_micro_batch": 16384,
                "gradient_checkpointing": True,
                "save_steps": 5,
                "warmup_ratio": 0.1,
                "merge_adapter": max_steps > 10,
            },
        }
    )


def write_slice_checkpoint(out: Path, layers: int) -> float:
    """gpt-oss-120b's shape with `layers` layers, packed MXFP4 experts, saved as a gpt-oss checkpoint; GB."""
    import torch
    import train_throughput as tt
    from safetensors.torch import save_file
    from toolkit_train.mxfp4 import QUANTIZATION_CONFIG
    from toolkit_train.tiny_model import build_tokenizer

    config = tt.gpt_oss_config(False, layers=layers, size="120b")
    model = tt.build_packed_model(config, "cuda", "eager")
    state = {key: value.detach().cpu().contiguous() for key, value in model.state_dict().items()}
    del model
    torch.cuda.empty_cache()
    out.mkdir(parents=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.quantization_config = QUANTIZATION_CONFIG
    config.save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    return sum(v.numel() * v.element_size() for v in state.values()) / 1e9


def run(root: Path, train: TrainSettings) -> dict:
    config = root / "input" / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "hyperparameters.json").write_text(json.dumps(to_hyperparameters(train)))
    env = dict(os.environ, TOOLKIT_ML_ROOT=str(root), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    start = time.perf_counter()
    script = REPO / "entrypoints" / "toolkit_train" / "train.py"
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - start
    lines = done.stdout.splitlines()
    metrics = [line for line in lines if line.startswith("[metrics]")]
    return {
        "rc": done.returncode,
        "seconds": round(seconds, 1),
        "compiled": any("compiling" in line for line in lines),
        "resumed": next((line for line in lines if "resum" in line.lower()), ""),
        "merged": next((line for line in lines if "merged" in line.lower()), ""),
        "peak_gpu": next((line for line in lines if "peak" in line.lower()), ""),
        "saves": [line for line in lines if "saved and sealed" in line],  # size and time of each checkpoint save
        "steps": [int(m.split("step=")[1].split("/")[0]) for m in metrics],
        "losses": [float(m.split("loss=")[1].split()[0]) for m in metrics],
        "tail": "" if done.returncode == 0 else (done.stdout + done.stderr)[-3000:],
        "trained": next((line for line in lines if line.startswith("[toolkit] trained:")), ""),  # what moved, ran
    }


def slowest_save(result: dict) -> float | None:
    """The longest checkpoint save of a run, from the entrypoint's `... saved and sealed in S s` lines."""
    times = [float(line.rsplit(" in ", 1)[1].split(" s")[0]) for line in result["saves"]]
    return max(times) if times else None


def main_slice(layers: int, expert_lora: bool = False) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(scratch) / "gpt-oss-120b-slice"
        size = write_slice_checkpoint(model, layers)
        first = run(Path(scratch) / "run", slice_settings(model, 10, expert_lora))
        resumed = run(Path(scratch) / "run", slice_settings(model, 15, expert_lora))
        merged = Path(scratch) / "run" / "model" / "merged"
        merged_gb = sum(f.stat().st_size for f in merged.glob("*.safetensors")) / 1e9 if merged.exists() else 0
    rows = [
        {"run": f"120b slice ({layers} layers, {size:.1f} GB packed), 10 steps", "rc": first["rc"],
         "seconds": first["seconds"], "steps": first["steps"][-1:], "first_loss": first["losses"][:1],
         "last_loss": first["losses"][-1:], "slowest_save_s": slowest_save(first)},
        {"run": "resumed to 15 + merge", "rc": resumed["rc"], "seconds": resumed["seconds"],
         "steps": resumed["steps"][:1] + resumed["steps"][-1:], "first_loss": resumed["losses"][:1],
         "last_loss": resumed["losses"][-1:], "slowest_save_s": slowest_save(resumed)},
    ]  # fmt: skip
    name = "entrypoint_gpu_120b_slice" + ("_expert_lora" if expert_lora else "")
    report(name, rows, {"layers": layers, "checkpoint_gb": round(size, 2), "expert_lora": expert_lora,
                        "merged_gb": round(merged_gb, 2), "runs": {"first": first, "resumed": resumed}})  # fmt: skip


def main() -> None:
    from toolkit_train.tiny_model import _build

    if "--shape" in sys.argv:
        layers = int(sys.argv[sys.argv.index("--layers") + 1]) if "--layers" in sys.argv else 8
        main_slice(layers, expert_lora="--expert-lora" in sys.argv)
        return

    with tempfile.TemporaryDirectory() as scratch:
        model = Path(scratch) / "tiny-gpt-oss-random"  # the builtin's architecture and tokenizer, not pretrained
        _build(model, mxfp4=False, pretrain=False)
        eager = run(Path(scratch) / "eager", settings(model, False, 20))
        auto = run(Path(scratch) / "auto", settings(model, "auto", 20))
        resumed = run(Path(scratch) / "auto", settings(model, "auto", 30))
    gap = max((abs(a - b) for a, b in zip(eager["losses"], auto["losses"], strict=False)), default=None)
    rows = [
        {"run": "compile_layers: false, 20 steps", "rc": eager["rc"], "compiled": eager["compiled"],
         "seconds": eager["seconds"], "first_loss": eager["losses"][:1], "last_loss": eager["losses"][-1:]},
        {"run": "compile_layers: auto, 20 steps", "rc": auto["rc"], "compiled": auto["compiled"],
         "seconds": auto["seconds"], "first_loss": auto["losses"][:1], "last_loss": auto["losses"][-1:]},
        {"run": "auto, resumed to 30", "rc": resumed["rc"], "compiled": resumed["compiled"],
         "seconds": resumed["seconds"], "first_loss": resumed["losses"][:1], "last_loss": resumed["losses"][-1:]},
    ]  # fmt: skip
    report("entrypoint_gpu", rows, {"max_loss_gap_compiled_vs_eager": gap,
                                    "runs": {"eager": eager, "auto": auto, "resumed": resumed}})  # fmt: skip


if __name__ == "__main__":
    main()
