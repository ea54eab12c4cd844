"""Per-row scores of a generated reply (0..1, higher is better; None where a metric does not apply to the row).

One table, METRICS: the report, the gate and the tests read it (a new metric is one row here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from toolkit_train.methods.rewards import runaway

from toolkit.config.metrics import EVAL_METRICS, FORMAT_VALID, PREFERENCE_ACCURACY
from toolkit.deploy.client import reply_problems


@cache
def _rouge():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


def rouge_l(generated: Any) -> float | None:
    return _rouge().score(generated.row.reference, generated.content)["rougeL"].fmeasure


def chrf(generated: Any) -> float | None:
    from sacrebleu.metrics import CHRF

    return CHRF().sentence_score(generated.content, [generated.row.reference]).score / 100


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


SCORERS = {"rougeL": rouge_l, "chrF": chrf, "reasoning_language": reasoning_language, FORMAT_VALID: format_valid}
# The config's vocabulary and the scorers are one table in two halves: these score generated replies (a supervised
# fine-tune's held-out rows); preference_accuracy scores a preference-tuned run's held-out pairs
# (toolkit/evaluate/preference.py), whose replies are scored by likelihood, not generated.
PAIR_METRICS = frozenset({PREFERENCE_ACCURACY})
if set(SCORERS) != set(EVAL_METRICS) - PAIR_METRICS:
    raise ImportError(f"scorers {sorted(SCORERS)} differ from the report's metrics {sorted(EVAL_METRICS)}")
METRICS = tuple(Metric(name, SCORERS[name], describes) for name, describes in EVAL_METRICS.items()
                if name in SCORERS)  # fmt: skip
METRIC_NAMES = tuple(m.name for m in METRICS)  # a generated reply's (a DPO run's pairs: preference.DESCRIBES)


def score(generated: Any) -> dict[str, float | None]:
    """Every metric of one generated row; a row that failed to generate scores None everywhere (counted apart)."""
    if generated.error is not None:
        return dict.fromkeys(METRIC_NAMES)
    return {m.name: m.score(generated) for m in METRICS}
