"""Seconds per training step of the tiny gpt-oss on CPU, through the real entrypoint (local target).

Compares LoRA on attention only against attention + experts in the same run. Run: python bench/cpu_train_step.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from common import report

import toolkit

STEPS = 20
VARIANTS = {
    "attention (q/k/v/o)": ["lora.target_parameters=[]"],
    "attention + experts": [],
}


def main() -> None:
    rows = []
    for label, overrides in VARIANTS.items():
        with tempfile.TemporaryDirectory() as out:
            job = toolkit.train(
                "tiny-gpt-oss-local",
                overrides=[*overrides, f"local.output_dir={out}", f"training.max_steps={STEPS}",
                           "training.save_steps=0", "training.merge_adapter=false"],
            )  # fmt: skip
            state = job.wait()
            assert state.status.value == "Completed", state
            run = json.loads(Path(out, "model", "run.json").read_text())
        final = next(e for e in reversed(run["log_history"]) if "train_runtime" in e)
        seconds = float(final["train_runtime"])
        rows.append(
            {"lora": label, "steps": STEPS, "s_per_step": round(seconds / STEPS, 4),
             "tokens_per_s": round(run["log_history"][-2].get("num_input_tokens_seen", 0) / seconds),
             "final_loss": round(run["train_loss"], 4)}
        )  # fmt: skip
    base = rows[0]["s_per_step"]
    for row in rows:
        row["vs_attention"] = f"{row['s_per_step'] / base:.2f}x"
    report("cpu_train_step", rows)


if __name__ == "__main__":
    main()
