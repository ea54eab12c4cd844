"""DPO's trainer (training.method dpo): TRL's DPOTrainer on the pairs this package rendered, the base as its
reference; packed micro-batches of pairs where training.packing asks."""

from __future__ import annotations

from typing import Any

from ..run.ranks import log
from ..run.trainer import packs_pairs
from ..settings import TrainSettings
from . import Built
from .reference import base_as_reference, score_trained_positions_only


def prepare(settings: TrainSettings, paths: Any, model: Any, tokenizer: Any, dataset: Any, eval_dataset: Any) -> Built:
    packed = packs_pairs(settings)
    layout = "each micro-batch's replies packed in one row, no padding" if packed else "unpacked"
    log(f"DPO on {len(dataset)} chosen/rejected pairs ({layout}), beta {settings.training.dpo.beta}, "
        f"loss {settings.training.dpo.loss_type}; the reference: the base model, adapter off")  # fmt: skip
    return Built(preference_trainer_class(packed), dataset, eval_dataset)


def preference_trainer_class(packed: bool = False) -> type:
    """TRL's DPOTrainer on pairs this package rendered with harmony already (data.py: prompt_ids, chosen_ids,
    rejected_ids): its own preparation would render them again with the tokenizer's chat template, which is not
    what vLLM serves gpt-oss with. The reference: the base, adapter off (base_as_reference).

    packed: TRL's loss, its forwards made through a decoder that packs the padded replies into one row
    (packing.pairs_packed; TRL 1.16's own padding_free is disabled for DPO). Its name, `_compute_loss`, is TRL 1.16's
    (tests/toolkit_train/methods/test_dpo_parity.py compares it with plain TRL, packed and not)."""
    from trl import DPOTrainer

    score_trained_positions_only()

    class PreferenceTrainer(base_as_reference(DPOTrainer)):  # type: ignore[misc]
        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset

        def _compute_loss(self, model: Any, inputs: Any, return_outputs: Any) -> Any:
            if not packed:
                return super()._compute_loss(model, inputs, return_outputs)
            from ..kernels.packing import pairs_packed

            causal_lm = self.accelerator.unwrap_model(self.model).get_base_model()
            with pairs_packed(causal_lm.get_decoder(), causal_lm.config):
                return super()._compute_loss(model, inputs, return_outputs)

    return PreferenceTrainer
