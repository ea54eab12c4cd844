"""The eval report's metrics: one table that the config (registry.gate), the applicability table and the scorers
read."""

from __future__ import annotations

# The eval report's metrics, each with what it measures: the vocabulary registry.gate names here and
# toolkit.evaluate.scoring scores (its table of scorers is keyed by these names, checked on import).
PREFERENCE_ACCURACY = "preference_accuracy"  # a DPO run's held-out pairs (toolkit/evaluate/preference.py)
FORMAT_VALID = "format_valid"  # the promotion gate's format floor reads this metric (registry.gate.min_format_valid)
EVAL_METRICS = {
    "rougeL": "ROUGE-L F1 of the final channel against the reference answer",
    "chrF": "chrF of the final channel against the reference answer (0..1)",
    "reasoning_language": "analysis channel in the requested reasoning language",
    FORMAT_VALID: "an answer (and reasoning apart, where the model writes it), no special tokens, stop reached, no "
    "runaway repetition",
    PREFERENCE_ACCURACY: "held-out pairs (training.method dpo): the chosen reply more likely than the rejected",
}
