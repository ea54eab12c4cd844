"""Training methods: one record each, as model families and targets have one, so that the code asks a record's fields
instead of comparing `training.method` with a name (tests/toolkit_train/methods/test_methods.py fails on a method name
compared outside this module).

A record says what the method trains on (the data formats whose rows it reads, said in the refusal of another's),
its own settings section under `training`, TRL's config class and the arguments the method adds to it, whether its
rows are chosen/rejected pairs (tokenized as pairs, packed as one row per micro-batch's pairs, and scored by
`toolkit eval` on the held-out pairs by likelihood rather than by generating), and what the config's description
says of it. The trainer each builds is its module's in toolkit_train/trainers/ (`trainer`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TrainingMethod:
    name: str
    describes: str  # the config's description of it (training.method)
    reads: str  # the rows it trains on, in words: "conversations", "chosen/rejected pairs"
    data_formats: tuple[str, ...]  # the data.format values whose rows it reads; the first is the one advised
    format_hint: str = ""  # what such rows hold, said beside the advised format
    section: str | None = None  # its own settings: training.<section>
    trl_config: str = "SFTConfig"  # TRL's config class (trl.<name>)
    # the arguments it adds to TRL's config, from training's settings
    config_arguments: Callable[[Any], dict[str, Any]] = field(default=lambda training: {})
    # its rows are chosen/rejected pairs: tokenized as pairs, packed per micro-batch's pairs, and scored by `toolkit
    # eval` on the held-out pairs by likelihood (nothing generated: no format to check, preference_accuracy to gate on)
    pairs: bool = False
    # it trains on replies it samples itself from prompt rows, scored by rewards (GRPO): no labelled tokens, nothing
    # packed, no validation loss; `toolkit eval` generates on the held-out prompts as for SFT
    samples: bool = False
    # its trainer: the module of toolkit_train/trainers/ that prepares TRL's trainer class for it
    trainer: str = "sft"


def _dpo_arguments(training: Any) -> dict[str, Any]:
    # the reference: the same model with the adapter off (no second copy, nothing precomputed)
    return {"beta": training.dpo.beta, "loss_type": [training.dpo.loss_type], "precompute_ref_log_probs": False}


SFT = TrainingMethod(
    name="sft",
    describes="supervised fine-tuning on conversations",
    reads="conversations",
    data_formats=("multilingual-thinking", "messages"),
)
DPO = TrainingMethod(
    name="dpo",
    describes="preference tuning on chosen/rejected pairs (data.format: preference; with training.packing the chosen "
    "and rejected replies of a micro-batch's training.per_device_batch_size pairs run as one packed row)",
    reads="chosen/rejected pairs",
    data_formats=("preference",),
    format_hint=" (rows with messages, chosen and rejected)",
    section="dpo",
    trl_config="DPOConfig",
    config_arguments=_dpo_arguments,
    pairs=True,
    trainer="dpo",
)


def _grpo_arguments(training: Any) -> dict[str, Any]:
    grpo = training.grpo
    return {
        "num_generations": grpo.num_generations,
        "max_completion_length": grpo.max_completion_length,
        "temperature": grpo.temperature,
        "beta": grpo.beta,  # the KL term's weight; its reference: the same model with the adapter off
        "reward_weights": [reward.weight for reward in grpo.rewards],
        "remove_unused_columns": False,  # the rows' reference answers and languages reach the rewards
        "log_completions": False,
    }


GRPO = TrainingMethod(
    name="grpo",
    describes="reinforcement learning with verifiable rewards (GRPO: training.grpo.num_generations replies sampled "
    "per prompt by the model being trained, scored by training.grpo.rewards, a KL term to the base with the adapter "
    "off)",
    reads="prompts",
    data_formats=("prompts",),
    format_hint=" (rows with messages up to the user's turn, or the sample's fields; an assistant reply or `answer` "
    "is the reference)",
    section="grpo",
    trl_config="GRPOConfig",
    config_arguments=_grpo_arguments,
    samples=True,
    trainer="grpo",
)
METHODS: dict[str, TrainingMethod] = {method.name: method for method in (SFT, DPO, GRPO)}


def method_named(name: str) -> TrainingMethod:
    return METHODS[name]


def method_reading(data_format: str) -> TrainingMethod:
    """The method whose rows data.format holds."""
    return next(method for method in METHODS.values() if data_format in method.data_formats)


def names(pairs: bool | None = None, samples: bool | None = None) -> tuple[str, ...]:
    """The methods whose rows are (or are not) pairs, that do (or do not) sample their own replies: the
    applicability table's values."""
    return tuple(
        method.name
        for method in METHODS.values()
        if (pairs is None or method.pairs == pairs) and (samples is None or method.samples == samples)
    )
