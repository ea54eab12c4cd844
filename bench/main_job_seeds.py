"""The main job's margin across training seeds (#71: the demo's checks should hold on any seed, not on its own):
for each seed, the README's main job as scripts/demo.sh runs it (`toolkit train tiny-gpt-oss-local` with the demo's
held-out rows, then `toolkit eval` with its gate), with `--set training.seed=N` and any other --set, each seed a run
of its own (main-job-seed-N, under a temporary folder); then the demo's checks (scripts/main_job_check.py) on each
eval report.

  python bench/main_job_seeds.py --seeds 42,1,2 [--set training.learning_rate=6e-4 ...] [--tag _lr6e-4]
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
sys.path.insert(0, str(REPO))
from bench.common import report
from scripts.main_job_check import problems

PRESET = "tiny-gpt-oss-local"
HELD_OUT = ["--set", "data.eval.fraction=0.25", "--set", "data.eval.steps=10"]  # = scripts/demo.sh's held_out
GATE = ["--set", "registry.gate.metric=reasoning_language", "--set", "registry.gate.require_ci=true"]  # = its gate


def toolkit(work: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "toolkit.cli", *args]
    serve = os.environ.get("TOOLKIT_SERVE_PYTHON") or str(REPO / ".venv-serve" / "bin" / "python")  # the demo's
    env = dict(os.environ, TOOLKIT_SERVE_PYTHON=serve)
    result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    if result.returncode not in (0, 1):  # 1: the gate refused (eval), reported as a failed check below
        output = result.stdout[-2000:] + result.stderr[-2000:]
        raise RuntimeError(f"{' '.join(args)}: exit {result.returncode}\n{output}")
    return result


def one_seed(seed: int, overrides: list[str], work: Path) -> dict:
    name = f"main-job-seed-{seed}"  # its run and eval report under work/runs/<name>/
    sets = [*HELD_OUT, "--set", f"training.seed={seed}", "--set", f"name={name}"]
    for override in overrides:
        sets += ["--set", override]
    started = time.monotonic()
    trained = toolkit(work, "train", PRESET, *sets, "--fresh")
    if trained.returncode != 0:
        raise RuntimeError(f"seed {seed}: training failed\n{trained.stdout[-3000:]}{trained.stderr[-3000:]}")
    train_s = time.monotonic() - started
    toolkit(work, "eval", PRESET, *sets, *GATE, "--max-tokens", "128")
    metrics = json.loads((work / "runs" / name / "eval" / "report.json").read_text())
    m = metrics["metrics"]
    return {
        "seed": seed,
        "reasoning_language": f"{m['reasoning_language']['base']:.3f}->{m['reasoning_language']['fine-tuned']:.3f}",
        "skill_ci95": [round(x, 3) for x in m["reasoning_language"]["ci95"]],
        "chrF_ci95": [round(x, 3) for x in m["chrF"]["ci95"]],
        "format_valid": f"{m['format_valid']['base']:.3f}->{m['format_valid']['fine-tuned']:.3f}",
        "passes": not problems(metrics),
        "problems": "; ".join(problems(metrics)),
        "train_s": round(train_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="42,1,2")
    parser.add_argument("--set", action="append", default=[], dest="overrides", help="another override, key=value")
    parser.add_argument("--tag", default="", help="suffix of the result file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="main-job-seeds-") as work:
        rows = [one_seed(int(seed), args.overrides, Path(work)) for seed in args.seeds.split(",")]
    report(f"main_job_seeds{args.tag}", rows, {"overrides": args.overrides, "passed": sum(r["passes"] for r in rows)})


if __name__ == "__main__":
    main()
