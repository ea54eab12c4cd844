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
recomputation): first with `training.compile_layers: false`, then with `auto` (which compiles the attention blocks
and routers of packed MXFP4 layers), same seed and batches; their per-step losses are compared (LOSS_RTOL, as the
default shape), their wall times and tokens/s set side by side, and each run's `[toolkit] compiling ...` and
`[toolkit] trained: ... compiled_layers N` lines say which path ran. The compiled run is then resumed from its
checkpoint and merged (the merge keeps the experts MXFP4). Writes bench/results/entrypoint_gpu_120b_slice_compiled.json.
`--budget-s S`: the whole slice run's time limit; each entrypoint run is killed (rc 124) past it, and the JSON is
written after the comparison and again after the resume. `--repeat-eager`: the eager run once more after the
compiled one (its run-to-run loss gap: the floor the compiled gap stands beside; its wall time with warm caches).
`speedup_wall` is against the first eager run, which also pays the cold caches (page cache, kernel builds);
`speedup_wall_vs_eager_repeat` against the warm repeat; tokens/s (steady steps) is the like-for-like measure.

`--expert-lora`: the experts adapted too (lora.target_parameters, expert_r 8), written to
bench/results/entrypoint_gpu_120b_slice_expert_lora.json. Each run's `[toolkit] trained:` line
(toolkit_train/run/trained.py: which groups received gradients and moved, which experts class ran) is kept.

  python bench/entrypoint_gpu.py [--shape 120b-slice --layers 8 [--expert-lora] [--budget-s 560] [--repeat-eager]]
"""

from __future__ import annotations

import json
import os
import re
import statistics
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

# Compiled and eager runs of the same seed and batches agree "to bf16 rounding": at every step the two losses differ
# by at most bf16's unit roundoff (2^-8) relative to the eager loss, i.e. by no more than rounding the loss itself to
# bf16 would. The same criterion for both shapes; the metric lines print losses to 4 decimals (1e-4 absolute).
LOSS_RTOL = 2**-8
LOSS_CRITERION = "|loss_compiled - loss_eager| <= 2^-8 * |loss_eager| at every step (bf16 unit roundoff), same steps"
STEADY_SKIP = 2  # tokens/s: the median of a run's steps after its first two (the first compiles, the next may too)


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


def slice_settings(
    model: Path, max_steps: int, expert_lora: bool = False, compile_layers: bool | str = "auto"
) -> TrainSettings:
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
                "compile_layers": compile_layers,
                "merge_adapter": max_steps > 10,
            },
        }
    )


def write_slice_checkpoint(out: Path, layers: int) -> float:
    """gpt-oss-120b's shape with `layers` layers, packed MXFP4 experts, saved as a gpt-oss checkpoint; GB."""
    import torch
    import train_throughput as tt
    from safetensors.torch import save_file
    from toolkit_train.builtin.tiny_model import build_tokenizer
    from toolkit_train.kernels.mxfp4 import QUANTIZATION_CONFIG

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


def run(root: Path, train: TrainSettings, timeout: float = 900) -> dict:
    config = root / "input" / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "hyperparameters.json").write_text(json.dumps(to_hyperparameters(train)))
    env = dict(os.environ, TOOLKIT_ML_ROOT=str(root), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    start = time.perf_counter()
    script = REPO / "entrypoints" / "toolkit_train" / "train.py"
    try:
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=timeout)
        rc, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:  # killed (the child too) at the time limit: keep what it printed
        rc, stdout, stderr = 124, _text(expired.stdout), _text(expired.stderr)
    seconds = time.perf_counter() - start
    lines = stdout.splitlines()
    metrics = [line for line in lines if line.startswith("[metrics]")]
    compiling = next((line for line in lines if line.startswith("[toolkit] compiling")), "")
    trained = next((line for line in lines if line.startswith("[toolkit] trained:")), "")  # what moved, what ran
    layers = re.search(r"compiled_layers (\d+)", trained)
    return {
        "rc": rc,
        "seconds": round(seconds, 1),
        "compiled": bool(compiling),
        "compiling": compiling,  # `[toolkit] compiling ... N decoder layers`: only where compile_layers resolved on
        "compiled_layers": int(layers.group(1)) if layers else None,  # from the trained line's `ran:` part
        "resumed": next((line for line in lines if "resum" in line.lower()), ""),
        "merged": next((line for line in lines if "merged" in line.lower()), ""),
        "peak_gpu": next((line for line in lines if "peak gpu" in line.lower()), ""),
        "saves": [line for line in lines if "saved and sealed" in line],  # size and time of each checkpoint save
        "steps": [int(m.split("step=")[1].split("/")[0]) for m in metrics],
        "losses": [float(m.split("loss=")[1].split()[0]) for m in metrics],
        "tokens_per_second": [_value(m, "tokens_per_second") for m in metrics],
        "tail": "" if rc == 0 else (stdout + stderr)[-3000:],
        "trained": trained,
    }


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def _value(metrics_line: str, name: str) -> float | None:
    found = re.search(rf"\b{name}=(\S+)", metrics_line)
    return float(found.group(1)) if found else None


def steady_rate(result: dict) -> float | None:
    """Tokens/s once compiled: the median of the metric lines' per-step rates after the run's first STEADY_SKIP."""
    rates = [r for r in result["tokens_per_second"][STEADY_SKIP:] if r is not None]
    return round(statistics.median(rates), 1) if rates else None


def loss_agreement(eager: dict, compiled: dict) -> dict:
    """Per-step losses of the compiled run against the eager one (same seed, same batches), by LOSS_CRITERION."""
    pairs = list(zip(eager["losses"], compiled["losses"], strict=False))
    gaps = [round(abs(c - e), 6) for e, c in pairs]
    relative = [abs(c - e) / abs(e) for e, c in pairs]
    return {
        "criterion": LOSS_CRITERION,
        "relative_tolerance": LOSS_RTOL,
        "same_steps": bool(eager["steps"]) and eager["steps"] == compiled["steps"],
        "steps_compared": len(pairs),
        "per_step_abs_gap": gaps,
        "first_step_abs_gap": gaps[0] if gaps else None,  # identical weights: only the kernels differ
        "max_abs_gap": max(gaps, default=None),
        "max_rel_gap": max(relative, default=None),
        "passed": bool(pairs) and eager["steps"] == compiled["steps"] and all(r <= LOSS_RTOL for r in relative),
    }


def slowest_save(result: dict) -> float | None:
    """The longest checkpoint save of a run, from the entrypoint's `... saved and sealed in S s` lines."""
    times = [float(line.rsplit(" in ", 1)[1].split(" s")[0]) for line in result["saves"]]
    return max(times) if times else None


def path_check(result: dict, layers: int, compiled: bool) -> dict:
    """Which path a run took, from its own log lines: the compiled one logs `[toolkit] compiling the attention blocks
    and routers of N decoder layers` and its trained line says `compiled_layers N`; the eager one logs neither."""
    if compiled:
        ok = f"routers of {layers} decoder layers" in result["compiling"] and result["compiled_layers"] == layers
    else:
        ok = not result["compiling"] and result["compiled_layers"] == 0
    return {"expected": f"compiled ({layers} layers)" if compiled else "eager", "compiling_line": result["compiling"],
            "trained_compiled_layers": result["compiled_layers"], "confirmed": ok}  # fmt: skip


def slice_row(label: str, result: dict) -> dict:
    steps = result["steps"]
    return {"run": label, "rc": result["rc"], "compiled_layers": result["compiled_layers"],
            "seconds": result["seconds"], "tokens_per_s": steady_rate(result),
            "steps": steps[:1] + steps[-1:] if len(steps) > 1 else steps, "first_loss": result["losses"][:1],
            "last_loss": result["losses"][-1:], "slowest_save_s": slowest_save(result)}  # fmt: skip


def main_slice(layers: int, expert_lora: bool = False, budget: float = 1800, repeat_eager: bool = False) -> None:
    """Eager then compiled (compile_layers false, then auto; not with --expert-lora, where auto compiles nothing),
    10 steps each, compared; the compiled run resumed to 15 and merged."""
    deadline = time.perf_counter() + budget
    name = "entrypoint_gpu_120b_slice" + ("_expert_lora" if expert_lora else "_compiled")
    compare = not expert_lora

    def left() -> float:
        return max(deadline - time.perf_counter(), 1)

    with tempfile.TemporaryDirectory() as scratch:
        model = Path(scratch) / "gpt-oss-120b-slice"
        size = write_slice_checkpoint(model, layers)
        runs: dict = {}
        if compare:
            runs["eager"] = run(Path(scratch) / "eager", slice_settings(model, 10, expert_lora, False), left())
        runs["first"] = run(Path(scratch) / "run", slice_settings(model, 10, expert_lora), left())
        if compare and repeat_eager:  # same settings as the first eager run, after the compiled one
            runs["eager_repeat"] = run(Path(scratch) / "eager2", slice_settings(model, 10, expert_lora, False), left())

        def write(merged_gb: float | None) -> None:
            labels = {"eager": "compile_layers: false, 10 steps", "first": "compile_layers: auto, 10 steps",
                      "eager_repeat": "compile_layers: false again",
                      "resumed": "auto, resumed to 15 + merge"}  # fmt: skip
            head = f"120b slice ({layers} layers, {size:.1f} GB packed): "
            rows = [slice_row(head + labels[key] if i == 0 else labels[key], result)
                    for i, (key, result) in enumerate(runs.items())]  # fmt: skip
            extra: dict = {"layers": layers, "checkpoint_gb": round(size, 2), "expert_lora": expert_lora,
                           "merged_gb": merged_gb}  # fmt: skip
            if compare:
                eager, compiled = runs["eager"], runs["first"]
                agreement = loss_agreement(eager, compiled)
                paths = {"eager": path_check(eager, layers, False), "compiled": path_check(compiled, layers, True)}
                if "resumed" in runs:
                    paths["resumed"] = path_check(runs["resumed"], layers, True)
                if "eager_repeat" in runs:  # eager against eager: what the same path gives twice
                    repeat = runs["eager_repeat"]
                    paths["eager_repeat"] = path_check(repeat, layers, False)
                    floor = loss_agreement(eager, repeat)
                    agreement["eager_run_to_run"] = {k: floor[k] for k in ("per_step_abs_gap", "max_abs_gap")}
                    extra["speedup_wall_vs_eager_repeat"] = (
                        round(repeat["seconds"] / compiled["seconds"], 3) if compiled["seconds"] else None
                    )
                rates = steady_rate(eager), steady_rate(compiled)
                extra |= {
                    "loss_agreement": agreement,
                    "paths": paths,
                    "tokens_per_s_measure": f"median tokens_per_second after each run's first {STEADY_SKIP} steps",
                    "speedup_tokens_per_s": round(rates[1] / rates[0], 3) if all(rates) else None,
                    "speedup_wall": round(eager["seconds"] / compiled["seconds"], 3) if compiled["seconds"] else None,
                    "passed": agreement["passed"]
                    and all(p["confirmed"] for p in paths.values())
                    and all(r["rc"] == 0 for r in runs.values()),
                }
            report(name, rows, extra | {"runs": runs})

        if compare:
            write(None)  # the comparison, kept even if the resume runs past the budget
        runs["resumed"] = run(Path(scratch) / "run", slice_settings(model, 15, expert_lora), left())
        merged = Path(scratch) / "run" / "model" / "merged"
        merged_gb = sum(f.stat().st_size for f in merged.glob("*.safetensors")) / 1e9 if merged.exists() else 0
        write(round(merged_gb, 2))


def main() -> None:
    from toolkit_train.builtin.tiny_model import _build

    if "--shape" in sys.argv:
        layers = int(sys.argv[sys.argv.index("--layers") + 1]) if "--layers" in sys.argv else 8
        budget = float(sys.argv[sys.argv.index("--budget-s") + 1]) if "--budget-s" in sys.argv else 1800
        main_slice(layers, "--expert-lora" in sys.argv, budget, repeat_eager="--repeat-eager" in sys.argv)
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
                                    "loss_agreement": loss_agreement(eager, auto),
                                    "runs": {"eager": eager, "auto": auto, "resumed": resumed}})  # fmt: skip


if __name__ == "__main__":
    main()
