"""The one confidence interval every comparison reports: the paired difference's, by bootstrap over rows (held-out
rows in the eval report, benchmark documents in lm-evaluation-harness tasks)."""

from __future__ import annotations

import random
import statistics

BOOTSTRAP_SAMPLES = 2000
CONFIDENCE = 0.95


def bootstrap_interval(differences: list[float], seed: int = 0) -> tuple[float, float] | None:
    """The CONFIDENCE interval of the mean paired difference, by resampling rows (None for fewer than two)."""
    if len(differences) < 2:
        return None
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(differences, k=len(differences))) for _ in range(BOOTSTRAP_SAMPLES))
    tail = (1 - CONFIDENCE) / 2
    return means[int(tail * BOOTSTRAP_SAMPLES)], means[int((1 - tail) * BOOTSTRAP_SAMPLES) - 1]
