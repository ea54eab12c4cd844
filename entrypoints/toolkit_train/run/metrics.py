"""The `[metrics]` line: written here by the entrypoint once per logged step, read by everything that follows a job
(the toolkit's progress display, SageMaker's metric definitions). One format, one writer, one parser.

    [metrics] step=12/40 loss=1.2345 learning_rate=2.000e-04 grad_norm=0.5123 tokens_per_second=1234.5 ...
A line may carry a source prefix (`[pod-name] [metrics] ...` in EKS pod logs); the values are floats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PREFIX = "[metrics]"
# what each value means and how it is printed; SageMaker's metric definitions are made from these names
FIELDS = {
    "loss": ".4f",
    "learning_rate": ".3e",
    "grad_norm": ".4f",
    "tokens_per_second": ".1f",
    "gpu_memory_gib": ".2f",
    "eval_loss": ".4f",  # on its own line, at data.eval.steps and at the end
    "reward": ".4f",  # GRPO: the weighted sum of the rewards, the mean over the step's sampled replies
    "kl": ".4f",  # GRPO: the policy's distance from the base (adapter off), with training.grpo.beta > 0
}
SAGEMAKER_METRIC = {"eval_loss": "validation:loss"}  # SageMaker's names where not train:<name>
_LINE = re.compile(r"(?:^|\] )\[metrics\] step=(\d+)/(\d+)((?: \w+=\S+)*)\s*$")
_NUMBER = r"[0-9.eE+-]+"


@dataclass(frozen=True)
class Metrics:
    step: int
    total_steps: int
    values: dict[str, float] = field(default_factory=dict)


def format_metrics(step: int, total_steps: int, values: dict[str, float]) -> str:
    shown = " ".join(f"{name}={value:{FIELDS.get(name, '.4g')}}" for name, value in values.items())
    return f"{PREFIX} step={step}/{total_steps} {shown}".rstrip()


def parse_metrics(line: str) -> Metrics | None:
    """The metrics a line carries, or None for any other line."""
    match = _LINE.search(line.rstrip("\n"))
    if match is None:
        return None
    values = {}
    for pair in match.group(3).split():
        name, _, value = pair.partition("=")
        try:
            values[name] = float(value)
        except ValueError:
            continue
    return Metrics(int(match.group(1)), int(match.group(2)), values)


def metric_regex(name: str) -> str:
    """A regex whose group is `name`'s value in a metrics line (SageMaker's MetricDefinitions)."""
    return rf"\[metrics\] step=\S+ .*\b{name}=({_NUMBER})"
