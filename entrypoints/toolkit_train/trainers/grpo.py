"""GRPO's trainer (training.method grpo): TRL's GRPOTrainer sampling replies to the family's own prompt ids,
scored by training.grpo.rewards, a KL term to the base with the adapter off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..run.ranks import log
from ..settings import TrainSettings
from . import Built
from .reference import base_as_reference, score_trained_positions_only


def prepare(settings: TrainSettings, paths: Any, model: Any, tokenizer: Any, prompts: Any, eval_dataset: Any) -> Built:
    """TRL's GRPOTrainer on the family's own prompt ids (the dataset's prompt_ids, rendered as the server renders a
    request: TRL would re-tokenize the prompt's text), with training.grpo.rewards as its reward functions; the KL
    term's reference is the base, adapter off (base_as_reference)."""
    from trl import GRPOTrainer

    from ..data import chat_format_of
    from ..layout import data_source
    from ..methods.rewards import reward_functions

    score_trained_positions_only()  # the sampled replies' positions, not the prompts' (CPU: most of a step)
    ids_of = dict(zip(prompts["prompt"], prompts["prompt_ids"], strict=True))

    class FamilyPrompts(base_as_reference(GRPOTrainer)):  # type: ignore[misc]
        def _tokenize_prompts(self, texts: list):
            return [list(ids_of[text]) for text in texts], None, {}

    grpo, harmony = settings.training.grpo, chat_format_of(settings.model).name == "harmony"
    source = Path(data_source(settings, paths))
    data_dir = (source if source.is_dir() else source.parent) if source.exists() else None
    ends = model.generation_config.eos_token_id  # where sampling stops, as TRL reads it: a reply that ended itself
    end_ids = [tokenizer.eos_token_id, *([] if ends is None else [ends] if isinstance(ends, int) else ends)]
    rewards = reward_functions([r.name for r in grpo.rewards], data_dir, tokenizer, harmony, end_ids,
                               settings.data.reasoning == "keep")  # fmt: skip
    log(f"GRPO on {len(prompts)} prompts, {grpo.num_generations} replies each (up to {grpo.max_completion_length} "
        f"tokens, temperature {grpo.temperature}), rewards {', '.join(f'{r.name} x{r.weight:g}' for r in grpo.rewards)}"
        f", KL beta {grpo.beta} to the base (adapter off)")  # fmt: skip
    return Built(FamilyPrompts, prompts, None, {"reward_funcs": rewards})  # no held-out loss: nothing labelled
