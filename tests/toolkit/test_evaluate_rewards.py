"""`toolkit eval` scores what a GRPO run was rewarded for: exact_match and regex_match are GRPO's reward functions on a
served reply, in a config's report where it asks for them (a reward of that name, or registry.gate.metric); a prompt
without a reference answer is asked as it is (the metrics against a reference leave it out)."""

from __future__ import annotations

import json

import pytest

from toolkit.config import load_config
from toolkit.evaluate import EvalRow, Generated, eval_rows
from toolkit.evaluate.report import build, generated_scoring
from toolkit.evaluate.scoring import METRIC_NAMES, metrics_asked, score

BOTH_MATCHES = "[{name: exact_match}, {name: regex_match, weight: 0.5}]"


def generated(content: str, reference: str, finish: str = "stop") -> Generated:
    return Generated(EvalRow("row 0", [], reference, None), content, "thinking", finish)


def test_exact_and_regex_match_score_a_served_reply_as_the_rewards_score_a_sampled_one():
    metrics = metrics_asked(load_config("tiny-gpt-oss-grpo", ["registry.gate.metric=exact_match"]))
    exact = next(m for m in metrics if m.name == "exact_match")
    assert exact.score(generated("  The answer is 42. ", "the answer  is 42.")) == 1.0  # case and spacing aside
    assert exact.score(generated("42", "43")) == 0.0
    assert exact.score(generated("42", "")) is None  # no reference: not scored
    regex = next(m for m in metrics_asked(load_config("tiny-gpt-oss-grpo", ["registry.gate.metric=regex_match"]))
                 if m.name == "regex_match")  # fmt: skip
    assert regex.score(generated("It is 1440 minutes.", r"\b1440\b")) == 1.0
    assert regex.score(generated("It is 1400 minutes.", r"\b1440\b")) == 0.0
    no_reference = score(generated("Paris", ""))
    assert no_reference["rougeL"] is None and no_reference["chrF"] is None


@pytest.mark.parametrize(
    ("preset", "overrides", "added"),
    [
        ("tiny-gpt-oss-local", [], set()),  # an SFT run: the four always scored
        ("tiny-gpt-oss-grpo", [], set()),  # the preset's rewards: format_valid, reasoning_language (always scored)
        ("tiny-gpt-oss-grpo", [f"training.grpo.rewards={BOTH_MATCHES}"], {"exact_match", "regex_match"}),
        ("tiny-gpt-oss-local", ["registry.gate.metric=regex_match"], {"regex_match"}),  # what the gate reads
    ],
)
def test_a_configs_report_carries_the_metrics_it_asks_for(preset, overrides, added):
    names = {m.name for m in metrics_asked(load_config(preset, overrides))}
    assert names == set(METRIC_NAMES) | added


def test_a_prompt_without_a_reference_is_asked_whole_and_scored_where_it_can_be(tmp_path):
    """It used to lose its user message (taken as the reference answer): the model was asked the system line alone."""
    rows = [{"messages": [{"role": "system", "content": "reasoning language: French"},
                          {"role": "user", "content": f"What is {n} plus {n}?"}]} for n in range(8)]  # fmt: skip
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    overrides = [f"data.source={source}", "data.format=prompts", "data.eval.fraction=0.25",
                 "training.grpo.rewards=[{name: format_valid}, {name: exact_match}]"]  # fmt: skip
    config = load_config("tiny-gpt-oss-grpo", overrides)
    held = eval_rows(config)
    assert len(held) == 2
    for row in held:
        assert row.messages[-1]["role"] == "user" and row.messages[-1]["content"].startswith("What is")
        assert row.reference == "" and row.reasoning_language == "French"
    scoring = generated_scoring(metrics_asked(config))
    from toolkit.evaluate import ModelResult

    results = [ModelResult(label, "served", [Generated(row, "16", "Je calcule.", "stop") for row in held])
               for label in ("base", "fine-tuned")]  # fmt: skip
    report = build(results, scoring=scoring)
    assert report["metrics"]["exact_match"]["rows"] == 0  # nothing to match against: no row scored
    assert report["metrics"]["format_valid"]["rows"] == 2


def test_a_users_reward_is_named_as_not_scored_by_the_eval():
    from toolkit.evaluate.flow import unscored_rewards

    rewards = "training.grpo.rewards=[{name: format_valid}, {name: 'short.py:brevity'}]"
    assert unscored_rewards(load_config("tiny-gpt-oss-grpo", [rewards])) == ["short.py:brevity"]
    assert unscored_rewards(load_config("tiny-gpt-oss-grpo", [])) == []
    assert unscored_rewards(load_config("tiny-gpt-oss-local", [])) == []  # SFT: no rewards
