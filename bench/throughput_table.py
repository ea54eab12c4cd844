"""Build the one table of measured training throughput that `toolkit plan` reads (toolkit/resources/throughput.json)
from bench/results: which rows are current is chosen here; every number is copied from the cited result file.

Run: python bench/throughput_table.py   (tests/toolkit/test_plan.py fails when the shipped table and this differ)
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TABLE = ROOT / "toolkit" / "resources" / "throughput.json"
CAPPED = "an H200 with its allocator capped at an H100 80GB's 85.52 GB: an H100's memory, an H200's compute"
M20, M120 = "openai/gpt-oss-20b", "openai/gpt-oss-120b"

# (result file, row name, model, expert LoRA, GPU, GPU memory GiB, note): the current measurement of each setting
SELECTED = [
    ("train_throughput_1gpu_compiled_gated.json", "recipe", M20, False, "H200", 141, ""),
    ("train_throughput_1gpu_compiled_gated.json", "toolkit-12k-compiled", M20, False, "H200", 141, ""),
    ("train_throughput_1gpu_compiled_gated.json", "toolkit-8k-compiled", M20, False, "H200", 141, ""),
    ("train_throughput_1gpu_20b_h100_80gb.json", "toolkit-8k-compiled", M20, False, "H100", 80, CAPPED),
    ("train_throughput_1gpu_after_router_fix.json", "toolkit-gc", M20, False, "H200", 141, ""),
    ("train_throughput_1gpu_recipe_rows.json", "toolkit-2k-compiled", M20, False, "H200", 141, ""),
    ("train_throughput_1gpu_mxfp4.json", "20b-mxfp4-12k", M20, False, "H200", 141, ""),
    ("train_throughput_1gpu_experts.json", "recipe-experts", M20, True, "H200", 141, ""),
    ("train_throughput_1gpu_experts.json", "toolkit-experts", M20, True, "H200", 141, ""),
    ("train_throughput_1gpu_experts.json", "toolkit-experts-8k", M20, True, "H200", 141, ""),
    ("train_throughput_1gpu_h100_80gb.json", "120b-mxfp4-8k-gc", M120, False, "H100", 80, CAPPED),
    ("train_throughput_1gpu_h100_80gb.json", "120b-mxfp4-16k-gc", M120, False, "H100", 80, CAPPED),
    ("train_throughput_1gpu_mxfp4_fixed_expandable.json", "120b-mxfp4-4k-gc", M120, False, "H200", 141, ""),
    ("train_throughput_1gpu_mxfp4_fixed_expandable.json", "120b-mxfp4-8k-gc", M120, False, "H200", 141, ""),
    ("train_throughput_1gpu_mxfp4_fixed_expandable.json", "120b-mxfp4-16k-gc", M120, False, "H200", 141, ""),
    ("train_throughput_1gpu_mxfp4_fixed_expandable.json", "120b-mxfp4-24k-gc", M120, False, "H200", 141, ""),
    ("train_throughput_1gpu_after_router_fix.json", "120b-mxfp4-32k-gc", M120, False, "H200", 141, ""),
]
# DDP over 2 GPUs against 1 GPU, same stack and rows: the one multi-GPU measurement the scaling of larger
# candidates rests on (more GPUs and more nodes are not measured)
DDP_PAIR = (("train_throughput_2gpu.json", "toolkit-8k"), ("train_throughput_x2host_1gpu.json", "toolkit-8k"))


def row(file: str, name: str) -> dict:
    rows = json.loads((RESULTS / file).read_text())["rows"]
    found = [r for r in rows if r.get("name") == name and "tokens_per_s" in r]
    assert len(found) == 1, f"{file}: {len(found)} measured rows named {name}"
    return found[0]


def build() -> dict:
    measured = []
    for file, name, model, expert_lora, gpu, memory, note in SELECTED:
        r = row(file, name)
        budget = r["tokens_per_micro_batch"]
        measured.append({
            "model": model, "experts": "mxfp4" if "mxfp4" in str(r.get("experts")) else "bf16",
            "expert_lora": expert_lora, "packed": bool(r["packing"]),
            "tokens_per_micro_batch": budget if isinstance(budget, int) else None,
            "max_length": r["max_length"], "gradient_checkpointing": bool(r["gc"]), "gpu": gpu,
            "gpu_memory_gib": memory, "tokens_per_s_per_gpu": r["tokens_per_s_per_gpu"],
            "peak_mem_gb": r["peak_mem_gb"],
            "source": f"bench/results/{file}", "row": name, "note": note,
        })  # fmt: skip
    (two_file, two_name), (one_file, one_name) = DDP_PAIR
    two, one = row(two_file, two_name), row(one_file, one_name)
    efficiency = round(two["tokens_per_s"] / (2 * one["tokens_per_s"]), 3)
    return {
        "about": "Measured training throughput per GPU (tokens/s), built by bench/throughput_table.py; do not edit.",
        "rows": measured,
        "ddp_2gpu_efficiency": {
            "value": efficiency, "sources": [f"bench/results/{two_file}", f"bench/results/{one_file}"],
        },
    }  # fmt: skip


if __name__ == "__main__":
    TABLE.write_text(json.dumps(build(), indent=1) + "\n")
    print(f"-> {TABLE}")
