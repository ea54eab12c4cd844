"""`toolkit eval` of a chat-template family for real (issue 47): the tiny Qwen3 and Qwen3-MoE presets' fine-tunes
(the session's shared runs, a fifth of the sample held out) and their bases, each served by real vLLM with Qwen3's
reasoning parser, and scored on the held-out rows in one command. The pre-trained tiny base writes Qwen3's shape
(<think> reasoning </think> answer), so the replies' format is checkable; the fine-tune's numbers are whatever 30
steps make them."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.evaluate.scoring import METRIC_NAMES

pytestmark = pytest.mark.integration
HELD_OUT = 12  # the preset's data.eval.fraction 0.2 of the sample's 60 rows


@pytest.mark.parametrize("run", ["qwen3_job_run", "qwen3_moe_job_run"], ids=["dense", "moe"])
def test_eval_scores_a_qwen3_fine_tune_and_its_base_with_the_reasoning_parsed_apart(run, request, tmp_path,
                                                                                    monkeypatch):  # fmt: skip
    cfg, model = request.getfixturevalue(run)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["eval", cfg.name, "--model-dir", str(model), "--max-tokens", "128", "--json",
                                      "--concurrency", "4"])  # fmt: skip
    assert result.exit_code == 0, result.output[-3000:]
    report = json.loads(result.stdout)
    assert set(report["models"]) == {"base", "fine-tuned"} and set(report["metrics"]) == set(METRIC_NAMES)
    for label, served in report["models"].items():
        assert served["rows"] == HELD_OUT and served["failed"] == [], label
    for name, metric in report["metrics"].items():
        assert metric["rows"] == HELD_OUT and 0 <= metric["base"] <= 1 and 0 <= metric["fine-tuned"] <= 1, name
    assert report["validation"]["rows"] == HELD_OUT and report["validation"]["eval_loss"] > 0
    # the base's replies come back as Qwen3's reasoning parser splits them: reasoning apart, an answer after it
    base = report["models"]["base"]["samples"]
    assert all(s["reasoning"].strip() and s["answer"].strip() and "<think>" not in s["answer"] for s in base), base
    assert report["metrics"]["format_valid"]["base"] >= 0.75, report["models"]["base"]["format_problems"]
    answers = {label: [s["answer"] for s in m["samples"]] for label, m in report["models"].items()}
    assert answers["base"] != answers["fine-tuned"]  # two models were really served
