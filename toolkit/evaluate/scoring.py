"""Per-row scores of a generated reply (0..1, higher is better; None where a metric does not apply to the row).

One table, METRICS: the report, the gate and the tests read it (a new metric is one row here); metrics_asked picks a
config's (exact_match and regex_match only where it asks for them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from toolkit_train.methods.rewards import runaway

from toolkit.config.metrics import (
    EVAL_METRICS,
    EXACT_MATCH,
    FORMAT_VALID,
    ON_REQUEST_METRICS,
    PREFERENCE_ACCURACY,
    REGEX_MATCH,
)
from toolkit.deploy.client import reply_problems


@cache
def _rouge():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


def rouge_l(generated: Any) -> float | None:
    if not generated.row.reference:
        return None  # a prompt without a reference answer (a GRPO row may have none)
    return _rouge().score(generated.row.reference, generated.content)["rougeL"].fmeasure


def chrf(generated: Any) -> float | None:
    from sacrebleu.metrics import CHRF

    if not generated.row.reference:
        return None
    return CHRF().sentence_score(generated.content, [generated.row.reference]).score / 100


def _as_reply(generated: Any) -> Any:
    from toolkit_train.methods.rewards import Reply

    return Reply(generated.reasoning, generated.content, finished=generated.finish_reason == "stop")


def exact_match(generated: Any) -> float | None:
    """GRPO's exact_match reward on a served reply (the same function)."""
    from toolkit_train.methods import rewards

    return rewards.exact_match(_as_reply(generated), generated.row.reference or None)


def regex_match(generated: Any) -> float | None:
    """GRPO's regex_match reward on a served reply (the same function)."""
    from toolkit_train.methods import rewards

    return rewards.regex_match(_as_reply(generated), generated.row.reference or None)


def reasoning_language(generated: Any) -> float | None:
    """1 when the analysis channel is in the language the row asks for; None for rows that ask for none (GRPO's
    reasoning_language reward, the same function)."""
    from toolkit_train.methods.rewards import language_matches

    return language_matches(generated.reasoning, generated.row.reasoning_language)


def format_problems(generated: Any) -> list[str]:
    """Why a reply is not a well-formed gpt-oss answer (empty: it is one): `toolkit invoke --check`'s problems,
    plus no end of message and runaway repetition."""
    problems = reply_problems(generated, reasoning=generated.row.reasoning)  # both parts present, no special tokens
    if generated.finish_reason != "stop":
        problems.append(f"stopped by {generated.finish_reason or 'nothing'} (no end of message)")
    if runaway(generated.reasoning) or runaway(generated.content):
        problems.append("runaway repetition")
    return problems


def format_valid(generated: Any) -> float | None:
    return float(not format_problems(generated))


@dataclass(frozen=True)
class Metric:
    name: str
    score: Callable[[Any], float | None]
    describes: str


SCORERS = {"rougeL": rouge_l, "chrF": chrf, "reasoning_language": reasoning_language, FORMAT_VALID: format_valid,
           EXACT_MATCH: exact_match, REGEX_MATCH: regex_match}  # fmt: skip
# The config's vocabulary and the scorers are one table in two halves: these score generated replies (a supervised
# fine-tune's held-out rows); preference_accuracy scores a preference-tuned run's held-out pairs
# (toolkit/evaluate/preference.py), whose replies are scored by likelihood, not generated.
PAIR_METRICS = frozenset({PREFERENCE_ACCURACY})
if set(SCORERS) != set(EVAL_METRICS) - PAIR_METRICS:
    raise ImportError(f"scorers {sorted(SCORERS)} differ from the report's metrics {sorted(EVAL_METRICS)}")
METRICS = tuple(Metric(name, SCORERS[name], describes) for name, describes in EVAL_METRICS.items()
                if name in SCORERS)  # fmt: skip
ALWAYS = tuple(m for m in METRICS if m.name not in ON_REQUEST_METRICS)
METRIC_NAMES = tuple(m.name for m in ALWAYS)  # every generated report's (a DPO run's pairs: preference.DESCRIBES)


def rewarded(config: Any) -> list[str]:
    """The rewards a config trains with (training.grpo.rewards' names; none for a method that samples nothing)."""
    return [reward.name for reward in config.training.grpo.rewards] if config.training.method_record.samples else []


def metrics_asked(config: Any) -> tuple[Metric, ...]:
    """A config's report metrics: every one scored always, and those scored on request that it asks for: a GRPO
    reward of that name (the eval scores what the run was rewarded for) or registry.gate.metric."""
    asked = set(rewarded(config))
    if config.registry.gate is not None:
        asked.add(config.registry.gate.metric)
    return tuple(m for m in METRICS if m.name not in ON_REQUEST_METRICS or m.name in asked)


def score(generated: Any, metrics: tuple[Metric, ...] = ALWAYS) -> dict[str, float | None]:
    """These metrics of one generated row; a row that failed to generate scores None everywhere (counted apart)."""
    if generated.error is not None:
        return dict.fromkeys(m.name for m in metrics)
    return {m.name: m.score(generated) for m in metrics}
