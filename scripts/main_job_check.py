"""The main job's checks on its eval report (scripts/test.sh after the demo; bench/main_job_seeds.py over seeds):
what the fine-tune is for, learned on rows neither model saw: reasoning_language's 95% interval of the difference
above zero on >= 12 rows, and the answers not significantly worse (chrF's interval reaches zero).

  python scripts/main_job_check.py runs/tiny-gpt-oss-local/eval/report.json   # exit 1 with the problems
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MIN_ROWS = 12


def problems(report: dict) -> list[str]:
    skill, answers = report["metrics"]["reasoning_language"], report["metrics"]["chrF"]
    found = [f"only {skill['rows']} held-out rows scored ({MIN_ROWS} needed)"] if skill["rows"] < MIN_ROWS else []
    if skill["ci95"][0] <= 0:
        found.append(f"reasoning_language's 95% interval {skill['ci95']} does not lie above zero")
    if answers["ci95"][1] < 0:
        found.append(f"chrF's 95% interval {answers['ci95']} lies below zero: the fine-tune made the answers worse")
    return found


if __name__ == "__main__":
    sys.exit("; ".join(problems(json.loads(Path(sys.argv[1]).read_text()))) or None)
