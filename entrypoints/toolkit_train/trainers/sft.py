"""SFT's trainer (training.method sft): TRL's SFTTrainer on the rendered conversations; with training.packing,
rows packed into token-budget micro-batches with their collator and trainer class."""

from __future__ import annotations

from functools import partial
from typing import Any

from ..run.ranks import log
from ..run.trainer import batch_semantics
from ..settings import TrainSettings
from . import Built


def prepare(settings: TrainSettings, paths: Any, model: Any, tokenizer: Any, dataset: Any, eval_dataset: Any) -> Built:
    from trl import SFTTrainer

    if not settings.training.packing:
        return Built(SFTTrainer, dataset, eval_dataset)
    from ..kernels.packing import collate, flex_length, packed_dataset, packed_trainer_class
    from ..run.model import attention_implementation

    budget, rows = settings.micro_batch_tokens(), len(dataset)
    dataset = packed_dataset(dataset, budget, settings.training.seed)
    if eval_dataset is not None:
        eval_dataset = packed_dataset(eval_dataset, budget, settings.training.seed)
    log(f"packed {rows} rows into {len(dataset)} micro-batches of <= {budget} tokens")
    log(batch_semantics(settings, rows, len(dataset)))
    fixed = flex_length(budget) if attention_implementation(settings.model) == "flex_attention" else None
    return Built(packed_trainer_class(), dataset, eval_dataset, {"data_collator": partial(collate, pad_to=fixed)})
