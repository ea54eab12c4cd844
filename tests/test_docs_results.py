"""The results the docs quote for a shipped preset come from one recorded run each: docs/results/<run>.json is the
report `toolkit eval` wrote for it, and the page shows that report's table as the toolkit renders it
(toolkit.evaluate.report.markdown). A number copied by hand into a page, or a page left behind by a new run, fails.
scripts/test.sh says whether the demo it runs reproduced the main job's record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.evaluate.report import markdown

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
# record -> (the page that shows its table, the preset it is the run of)
RECORDS = {
    "main-job.json": (REPO / "README.md", "tiny-gpt-oss-local"),
    "dpo.json": (REPO / "docs" / "preference-tuning.md", "tiny-gpt-oss-dpo"),
    "grpo.json": (REPO / "docs" / "grpo.md", "tiny-gpt-oss-grpo"),
}


def _table(report: dict) -> list[str]:
    return [line for line in markdown(report, report.get("validation")).splitlines() if line.startswith("|")]


@pytest.mark.parametrize("record", RECORDS)
def test_the_page_shows_the_recorded_runs_table(record):
    page, preset = RECORDS[record]
    report = json.loads((RESULTS / record).read_text())
    assert preset in json.dumps(report["scored_model"]) + json.dumps(report["models"]), f"{record}: not {preset}'s run"
    lines = page.read_text().splitlines()
    table = _table(report)
    at = [i for i, line in enumerate(lines) if line == table[0]]
    assert any(lines[i : i + len(table)] == table for i in at), (
        f"{page.relative_to(REPO)} does not show docs/results/{record}'s table; it is:\n" + "\n".join(table)
    )


def test_every_record_is_shown():
    assert sorted(p.name for p in RESULTS.glob("*.json")) == sorted(RECORDS)


def test_the_readmes_reply_is_the_recorded_main_jobs():
    """The reasoning and answer the README prints are the ones `toolkit invoke --check` got in the recorded run."""
    reply = json.loads((RESULTS / "main-job.json").read_text())["invoke"]
    lines = (REPO / "README.md").read_text().splitlines()
    assert f"reasoning: {reply['reasoning']}" in lines and f"answer: {reply['answer']}" in lines
