"""CLI start-up time: `toolkit --help` and `toolkit config validate`, against `import torch` as the baseline.

Target: under 0.5 s. Run: python bench/startup.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from common import report

RUNS = 7
COMMANDS = {
    "python -c pass (interpreter floor)": [sys.executable, "-c", "pass"],
    "toolkit --help": [sys.executable, "-m", "toolkit.cli", "--help"],
    "toolkit config validate gpt-oss-20b-lora": [
        sys.executable, "-m", "toolkit.cli", "config", "validate", "gpt-oss-20b-lora",
    ],
    "python -c 'import torch, transformers' (baseline)": [sys.executable, "-c", "import torch, transformers"],
}  # fmt: skip


def main() -> None:
    medians = {}
    for label, command in COMMANDS.items():
        times = []
        for _ in range(RUNS):
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
        medians[label] = statistics.median(times)
    baseline = medians["python -c 'import torch, transformers' (baseline)"]
    rows = [
        {"command": k, "median_s": round(v, 3), "vs_baseline": f"{v / baseline:.2f}x", "under_0.5s": v < 0.5}
        for k, v in medians.items()
    ]
    report("startup", rows, {"runs": RUNS})


if __name__ == "__main__":
    main()
