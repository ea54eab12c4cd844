"""The eval report's metrics: one table that the config (registry.gate), the applicability table and the scorers
read."""

from __future__ import annotations

# The eval report's metrics, each with what it measures: the vocabulary registry.gate names here and
# toolkit.evaluate.scoring scores (its table of scorers is keyed by these names, checked on import).
PREFERENCE_ACCURACY = "preference_accuracy"  # a DPO run's held-out pairs (toolkit/evaluate/preference.py)
FORMAT_VALID = "format_valid"  # the promotion gate's format floor reads this metric (registry.gate.min_format_valid)
EXACT_MATCH, REGEX_MATCH = "exact_match", "regex_match"  # GRPO's rewards of the same names, scored the same way
EVAL_METRICS = {
    "rougeL": "ROUGE-L F1 of the final channel against the reference answer",
    "chrF": "chrF of the final channel against the reference answer (0..1)",
    "reasoning_language": "analysis channel in the requested reasoning language",
    FORMAT_VALID: "an answer (and reasoning apart, where the model writes it), no special tokens, stop reached, no "
    "runaway repetition",
    EXACT_MATCH: "the final channel equals the reference answer (case and spacing aside)",
    REGEX_MATCH: "the final channel matches the reference answer read as a regular expression",
    PREFERENCE_ACCURACY: "held-out pairs (training.method dpo): the chosen reply more likely than the rejected",
}
# Scored only where a config asks for them (a GRPO reward of that name, or registry.gate.metric): a reference answer
# is rarely one to match word for word, so an SFT run's report does not carry two columns of zeros.
ON_REQUEST_METRICS = frozenset({EXACT_MATCH, REGEX_MATCH})
