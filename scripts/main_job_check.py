"""The main job's check on its eval report (scripts/test.sh after the demo; bench/main_job_seeds.py over seeds): what
the fine-tune is for, learned on rows neither model saw: reasoning_language's 95% interval of the difference above
zero on >= 12 rows. What it costs is printed beside it, not checked: on the tiny base every setting that teaches the
skill also ends some replies right after the analysis, which lowers the answers' chrF and format_valid (measured,
docs/setup.md); the README's table shows both.

  python scripts/main_job_check.py runs/tiny-gpt-oss-local/eval/report.json   # exit 1 with the problems
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MIN_ROWS = 12
COSTS = ("chrF", "format_valid")  # printed, not checked


def problems(report: dict) -> list[str]:
    skill = report["metrics"]["reasoning_language"]
    found = [f"only {skill['rows']} held-out rows scored ({MIN_ROWS} needed)"] if skill["rows"] < MIN_ROWS else []
    if skill["ci95"][0] <= 0:
        found.append(f"reasoning_language's 95% interval {skill['ci95']} does not lie above zero")
    return found


def costs(report: dict) -> str:
    """What the fine-tune cost the replies, one line: each metric's difference and interval."""
    shown = []
    for name in COSTS:
        metric = report["metrics"][name]
        low, high = metric["ci95"]
        shown.append(f"{name} {metric['difference']:+.3f} [{low:+.3f}, {high:+.3f}]")
    return "the fine-tune's cost (not checked): " + ", ".join(shown)


if __name__ == "__main__":
    report = json.loads(Path(sys.argv[1]).read_text())
    print(costs(report))
    sys.exit("; ".join(problems(report)) or None)
