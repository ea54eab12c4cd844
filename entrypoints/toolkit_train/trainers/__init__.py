"""A training method's trainer: one module per method (sft.py, dpo.py, grpo.py), named by the method's record
(toolkit_train.methods: TrainingMethod.trainer), each with `prepare(settings, paths, model, tokenizer, dataset,
eval_dataset) -> Built`: TRL's trainer class for the method and what it adds. build_trainer wraps what every method
shares (FSDP on CPU, a caller's last wrapper) and makes the trainer: what the
entrypoint trains with and the bench measures."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..layout import Paths
from ..run.moments import reached
from ..run.trainer import trainer_args, with_fsdp_on_cpu
from ..settings import TrainSettings


@dataclass
class Built:
    """A method's trainer class, the rows it trains and validates on (prepared for it), and its own arguments."""

    trainer_class: Any
    dataset: Any
    eval_dataset: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


def build_trainer(
    settings: TrainSettings,
    paths: Paths,
    model: Any,
    tokenizer: Any,
    dataset: Any,
    eval_dataset: Any = None,
    callbacks: list | None = None,
    args: Any = None,
    subclass: Callable[[type], type] | None = None,
) -> Any:
    """The trainer of these settings: training.method's module prepares its class and rows; FSDP on CPU where asked.
    args: the trainer's arguments (default: trainer_args'); subclass: a last wrapper of the trainer class (the
    bench's counters)."""
    from transformers.trainer_callback import PrinterCallback

    method = importlib.import_module(f"{__name__}.{settings.training.method_record.trainer}")
    built: Built = method.prepare(settings, paths, model, tokenizer, dataset, eval_dataset)
    trainer_class = built.trainer_class
    if settings.training.distributed == "fsdp":
        trainer_class = with_fsdp_on_cpu(trainer_class)
    if subclass is not None:
        trainer_class = subclass(trainer_class)
    trainer = trainer_class(
        model=model,
        args=args if args is not None else trainer_args(settings, paths),
        train_dataset=built.dataset,
        eval_dataset=built.eval_dataset,
        processing_class=tokenizer,
        callbacks=callbacks or [],
        **built.extra,
    )
    trainer.remove_callback(PrinterCallback)  # our Metrics lines replace its raw dict dumps
    reached("trainer-built", trainer)
    return trainer
