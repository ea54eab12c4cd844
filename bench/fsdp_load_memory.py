"""Host memory of loading the base model under FSDP: every rank reading it (before) against rank 0 alone (now).

Builds a random-weight gpt-oss scaled down in width and depth (gpt-oss's vocabulary, experts dominating the rest,
a few hundred MB of bf16 weights), then trains one step through the real entrypoint under
`torchrun --nproc-per-node N` (gloo, CPU) three ways, in the same run:
  - every rank reads the checkpoint: the entrypoint as it was (the tests' fault Python, tests/faults, with its
    switch every_rank_loads);
  - rank 0 reads it and the others build the model on the meta device (the entrypoint now: trainer.loads_from_rank0);
  - transformers' own switch alone (FSDP_CPU_RAM_EFFICIENT_LOADING with ACCELERATE_USE_FSDP and an initialized
    process group, what accelerate/TRL set): every rank calls from_pretrained, nothing else (no training).
While the ranks run, this process reads each rank's /proc/<pid>/status (VmHWM: the peak resident set, monotonic)
and /proc/<pid>/maps (whether the rank mapped a checkpoint file) every few milliseconds.

  python bench/fsdp_load_memory.py --ranks 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENTRYPOINT = REPO / "entrypoints" / "toolkit_train" / "train.py"
sys.path.insert(0, str(REPO / "entrypoints"))
sys.path.insert(0, str(REPO))
HOST_PEAK_PREFIX = "[toolkit] host memory peak: "  # = callbacks.HOST_PEAK_PREFIX (train.py is not imported here)
SHAPE = {  # gpt-oss's layout; ~305 M parameters (~0.61 GB in bf16): 2/3 in the experts, most of the rest the vocabulary
    "hidden_size": 256, "intermediate_size": 2048, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "num_local_experts": 64, "num_experts_per_tok": 2,
    "sliding_window": 64,
}  # fmt: skip


def build(out: Path, shape: dict | None = None) -> int:
    """A random-weight gpt-oss of `shape`, saved in bf16 with gpt-oss's tokenizer; returns the weights' bytes."""
    import torch
    from toolkit_train.builtin.tiny_model import build_tokenizer
    from transformers import GptOssConfig, GptOssForCausalLM

    tokenizer = build_tokenizer()
    config = GptOssConfig(
        vocab_size=len(tokenizer), layer_types=["sliding_attention", "full_attention"],
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id, tie_word_embeddings=False, **(shape or SHAPE),
    )  # fmt: skip
    torch.manual_seed(0)
    model = GptOssForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02)
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return sum(f.stat().st_size for f in out.glob("*.safetensors"))


def lay_out(root: Path, model_dir: Path, steps: int = 1) -> Path:
    from toolkit_train.settings import to_hyperparameters

    from toolkit.config import load_config

    settings = load_config(
        "tiny-gpt-oss-local",
        [f"model.id={model_dir}", "training.distributed=fsdp", f"training.max_steps={steps}", "training.save_steps=0",
         "training.merge_adapter=false", "training.logging_steps=1"],
    ).train_settings()  # fmt: skip
    (root / "input" / "config").mkdir(parents=True, exist_ok=True)
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(to_hyperparameters(settings)))
    return root


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found.append(child)
            todo.append(child)
    return found


def _rank_of(pid: int) -> int | None:
    try:
        env = dict(
            item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in item
        )
    except (OSError, ValueError):
        return None
    return int(env["RANK"]) if "RANK" in env and "LOCAL_RANK" in env else None


def _peak_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _maps_checkpoint(pid: int, model_dir: Path) -> bool:
    try:
        return any(str(model_dir) in line and ".safetensors" in line for line in Path(f"/proc/{pid}/maps").open())
    except OSError:
        return False


def run_ranks(command: list[str], env: dict, model_dir: Path, timeout: float = 600) -> dict:
    """Run a torchrun command; per rank: peak RSS (GiB) and whether it ever mapped a checkpoint file."""
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks: dict[int, dict] = {}
    pids: dict[int, int] = {}
    while process.poll() is None:
        if time.monotonic() - started > timeout:
            process.kill()
            raise TimeoutError(f"{command} ran past {timeout} s")
        for pid in _descendants(process.pid):
            if pid not in pids:
                rank = _rank_of(pid)
                if rank is None:
                    continue
                pids[pid] = rank
            seen = ranks.setdefault(pids[pid], {"peak_kib": 0, "mapped_checkpoint": False})
            peak = _peak_kib(pid)
            if peak is not None:
                seen["peak_kib"] = max(seen["peak_kib"], peak)
            seen["mapped_checkpoint"] = seen["mapped_checkpoint"] or _maps_checkpoint(pid, model_dir)
        time.sleep(0.005)
    stdout, stderr = process.communicate()
    return {
        "returncode": process.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "ranks": {
            r: {"peak_gib": round(v["peak_kib"] / 2**20, 3), "mapped_checkpoint": v["mapped_checkpoint"]}
            for r, v in sorted(ranks.items())
        },
        "stdout": stdout,
        "stderr": stderr,
    }


def train_once(work: Path, model_dir: Path, nproc: int, every_rank: bool, name: str) -> dict:
    """One training step through the entrypoint; the ranks' memory, the step's loss and the adapter written."""
    from safetensors.torch import load_file

    root = lay_out(work / name, model_dir)
    from tests import faults

    env = dict(os.environ, TOOLKIT_ML_ROOT=str(root), PYTHONUNBUFFERED="1", PYTHONPATH="", OMP_NUM_THREADS="1")
    env = faults.env(env, every_rank_loads=1 if every_rank else None)
    command = faults.command("-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", ENTRYPOINT)
    result = run_ranks(command, env, model_dir)
    if result["returncode"] != 0:
        raise RuntimeError(
            f"{name}: exit {result['returncode']}\n{result['stdout'][-3000:]}\n{result['stderr'][-3000:]}"
        )
    result["losses"] = [
        float(line.split("loss=")[1].split()[0])
        for line in result["stdout"].splitlines()
        if line.startswith("[metrics]")
    ]
    result["adapter"] = load_file(str(root / "model" / "adapter" / "adapter_model.safetensors"))
    for line in (result["stdout"] + result["stderr"]).splitlines():  # each rank's own report (train.HostMemory)
        if HOST_PEAK_PREFIX in line:
            gib, rank = line.split(HOST_PEAK_PREFIX)[1].split(" GiB (rank ")
            result["ranks"][int(rank.split()[0])]["loaded_gib"] = float(gib)
    return result


RANK_LOAD = """
import os, sys, torch.distributed as dist
os.environ.update(ACCELERATE_USE_FSDP="true", FSDP_CPU_RAM_EFFICIENT_LOADING="true")
dist.init_process_group("gloo")
from transformers import AutoModelForCausalLM
from transformers.integrations import is_fsdp_enabled
assert is_fsdp_enabled()
AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype="float32")
dist.barrier()
"""


def transformers_switch_alone(model_dir: Path, nproc: int) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "--no-python", sys.executable, "-c", RANK_LOAD, str(model_dir)]  # fmt: skip
    result = run_ranks(command, dict(os.environ, OMP_NUM_THREADS="1"), model_dir)
    if result["returncode"] != 0:
        raise RuntimeError(f"transformers' switch: exit {result['returncode']}\n{result['stderr'][-3000:]}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    from common import report

    work = Path(tempfile.mkdtemp(prefix="fsdp-load-"))
    model_dir = work / "model"
    weights = build(model_dir)
    gib = weights / 2**30
    before = train_once(work, model_dir, args.ranks, every_rank=True, name="every-rank")
    after = train_once(work, model_dir, args.ranks, every_rank=False, name="rank0")
    alone = transformers_switch_alone(model_dir, args.ranks)
    same = all(bool((before["adapter"][k] == after["adapter"][k]).all()) for k in before["adapter"])
    rows = []
    for label, result in (("every rank reads (before)", before), ("rank 0 reads, others meta (now)", after),
                          ("transformers' FSDP_CPU_RAM_EFFICIENT_LOADING alone (load only)", alone)):  # fmt: skip
        peaks = [r["peak_gib"] for r in result["ranks"].values()]
        loaded = [r.get("loaded_gib", r["peak_gib"]) for r in result["ranks"].values()]  # load only: its peak
        rows.append({
            "loading": label,
            "ranks": len(peaks),
            "loaded_peak_gib_per_rank": " / ".join(f"{p:.2f}" for p in loaded),
            "loaded_sum_gib": round(sum(loaded), 2),
            "run_peak_gib_per_rank": " / ".join(f"{p:.2f}" for p in peaks),
            "ranks_that_mapped_the_checkpoint": [r for r, v in result["ranks"].items() if v["mapped_checkpoint"]],
            "step1_loss": result.get("losses", [None])[0],
            "seconds": result["seconds"],
        })  # fmt: skip
    report(
        "fsdp_load_memory",
        rows,
        {
            "model": {
                **SHAPE,
                "vocab_size": 201088,
                "checkpoint_gib_bf16": round(gib, 3),
                "in_memory_gib_fp32": round(2 * gib, 3),
            },
            "adapter_after_step_equal": same,
            "note": "loaded_peak: each rank's peak RSS when training begins (model loaded, sharded by FSDP2, as "
            "the rank reports it: train.HostMemory; for the load-only row, the process's whole peak); run_peak: the "
            "peak RSS (VmHWM) over the whole run incl. the training step's CPU activations (the logits over the "
            "201k vocabulary), sampled by the parent every 5 ms. The fp32 training model is 2x the bf16 checkpoint; "
            "each rank also holds several hundred MB of torch, transformers and trainer state without any weights",
        },
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
